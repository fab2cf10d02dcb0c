"""Loaded by the Dagster run processes that `bench_sync.py` starts (it puts this folder on PYTHONPATH).

It changes nothing the run does. It marks moments the project does not log, on stderr as
`BENCH <epoch seconds> <logger> <message>`: the interpreter up (this file runs), the code location
starting to load (the first import of `feedapi_dagster`) and its definitions built
(`build_feedapi_definitions`), the Spark Connect session (`spark_session`, called by the
`SparkResource`), the feed table's check/creation (`FeedTable.ensure_table`), the asset checks
(`feed_check_results`), the maintenance check after the load (`due`, called by `FeedApiResource.load`) and the end of
the process's exit hooks (an `atexit` hook registered before any other). Processes the run starts
with the same environment (Dagster's compute-log pollers) load this file too; `bench_sync.py` keeps
the first mark of each name, and the exit mark is only the run process's. A function
that is not there (renamed in the library) is left unmarked: its stage merges into the one before.
The loader's own progress lines ("N events ... read and written by Spark as Delta version V in X s",
"nothing new (Spark's read took X s ...)", "cursors ... committed as Delta version V in Y s") are in the
run's Dagster event log.
"""

import atexit
import importlib.abc
import logging
import sys

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("BENCH %(created).6f %(name)s %(message)s"))
_log = logging.getLogger("feedapi_dagster")
_log.addHandler(_handler)
_log.setLevel(logging.INFO)
_log.propagate = False
_log.info("mark python start")


def _exiting():
    # registered first, so it runs after every other exit hook (Dagster's, pyspark's Connect client):
    # what follows is the interpreter's own teardown; only the run process (not the log pollers it starts)
    if any(arg == "execute_run" for arg in sys.argv):
        _log.info("mark exit hooks end")


atexit.register(_exiting)


def _marked(owner, attribute, label, generator=False, only_end=False):
    original = getattr(owner, attribute, None)
    if original is None:
        _log.info("not marked: %s.%s is gone", getattr(owner, "__name__", owner), attribute)
        return

    if generator:

        def wrapper(*args, **kwargs):
            _log.info("mark %s start", label)
            try:
                yield from original(*args, **kwargs)
            finally:
                _log.info("mark %s end", label)
    else:

        def wrapper(*args, **kwargs):
            if not only_end:
                _log.info("mark %s start", label)
            try:
                return original(*args, **kwargs)
            finally:
                _log.info("mark %s end", label)

    setattr(owner, attribute, wrapper)


def _resources(module):
    _marked(module, "spark_session", "connect")
    _marked(module, "feed_check_results", "checks", generator=True)
    _marked(module, "due", "maintenance")


_PATCHES = {
    "feedapi_dagster": lambda module: None,  # its import starting is the mark (see find_spec)
    "feedapi_dagster.orchestration.definitions": lambda module: _marked(
        module, "build_feedapi_definitions", "definitions", only_end=True
    ),
    "feedapi_dagster.orchestration.resources": _resources,
    "feedapi_dagster.lakehouse.feed_table": lambda module: _marked(module.FeedTable, "ensure_table", "table"),
}


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the modules above right after they are imported (importing nothing earlier itself)."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        if name == "feedapi_dagster":
            _log.info("mark location start")
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
