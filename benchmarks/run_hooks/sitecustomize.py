"""Loaded by the Dagster run processes that `bench_sync.py` starts (it puts this folder on PYTHONPATH).

It changes nothing the run does. It marks two moments the project does not log: the Spark Connect
session (pyspark import + connect) and the feed table's check/creation (`FeedTable.ensure_table`),
on stderr as `BENCH <epoch seconds> <logger> <message>`. The loader's own progress lines ("staged
in X s", "read N events ...", "commit took Y s") are in the run's Dagster event log.
"""
import importlib.abc
import logging
import sys

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("BENCH %(created).6f %(name)s %(message)s"))
_log = logging.getLogger("feedapi_dagster")
_log.addHandler(_handler)
_log.setLevel(logging.INFO)
_log.propagate = False


def _marked(owner, attribute, label):
    original = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        _log.info("mark %s start", label)
        try:
            return original(*args, **kwargs)
        finally:
            _log.info("mark %s end", label)

    setattr(owner, attribute, wrapper)


_PATCHES = {
    "feedapi_dagster.lakehouse.spark": lambda module: _marked(module, "connect_session", "connect"),
    "feedapi_dagster.lakehouse.delta": lambda module: _marked(module.FeedTable, "ensure_table", "table"),
}


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the modules above right after they are imported (importing nothing earlier itself)."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
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
