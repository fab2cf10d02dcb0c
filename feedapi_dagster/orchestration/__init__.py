"""Orchestration: the Dagster side of feeds (assets, checks, sensors, schedules, the resources), built
by `build_feedapi_definitions` from a `ProjectConfig`, or by the `FeedApiComponent` from a defs.yaml."""

from .config import FeedConfig, ProjectConfig
from .definitions import build_feedapi_definitions, feed_bindings
from .loads import RESOURCE_KEY
from .resources import FeedApiResource, SparkResource
from .translator import FeedApiTranslator, FeedTranslatorData

__all__ = [
    "RESOURCE_KEY",
    "FeedApiResource",
    "FeedApiTranslator",
    "FeedConfig",
    "FeedTranslatorData",
    "ProjectConfig",
    "SparkResource",
    "build_feedapi_definitions",
    "feed_bindings",
]
