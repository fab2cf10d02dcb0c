"""The code location: every feed of the feeds file (FEEDAPI_DAGSTER_CONFIG, else feeds.yaml here)."""
from feedapi_dagster.orchestration import build_definitions, load_config

defs = build_definitions(load_config())
