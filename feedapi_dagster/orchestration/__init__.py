"""Orchestration: the Dagster side of feeds (assets, checks, sensors, schedules, the Spark resource),
built by `build_feedapi_definitions` from a `ProjectConfig`, or by the `FeedApiComponent` from a defs.yaml."""
from .config import FeedConfig, ProjectConfig
from .definitions import SPARK_RESOURCE_KEY, build_feedapi_definitions, feed_bindings
from .resources import SparkResource
from .translator import FeedApiTranslator, FeedTranslatorData

__all__ = ["SPARK_RESOURCE_KEY", "FeedApiTranslator", "FeedConfig", "FeedTranslatorData",
           "ProjectConfig", "SparkResource", "build_feedapi_definitions", "feed_bindings"]
