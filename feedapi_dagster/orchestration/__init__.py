"""Orchestration: Dagster assets, sensors, schedules, resources and config, built from a feeds file."""
from .config import ConfigError, FeedConfig, ProjectConfig, load_config
from .definitions import build_definitions
from .resources import SparkResource

__all__ = ["ConfigError", "FeedConfig", "ProjectConfig", "SparkResource", "build_definitions", "load_config"]
