"""The code location: every feed of the feeds file (FEEDAPI_DAGSTER_CONFIG, else feeds.yaml here)."""
import gc

from feedapi_dagster.orchestration import build_definitions, load_config

defs = build_definitions(load_config())

# What is loaded by now (dagster, the libraries, the definitions) lives as long as the process:
# frozen, the collector stops walking it, and the interpreter's final collection skips it. Every run
# process then exits ~0.4 s sooner (measured by the benchmark of 2026-11-21).
gc.freeze()
