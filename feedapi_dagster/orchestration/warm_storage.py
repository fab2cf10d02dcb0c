"""Imported by `ForkServerRunLauncher`'s fork server: Dagster's storage schema check, done once per fork server.

Each time Dagster opens an instance storage (run, event log, schedule) and each new run's event-log
shard, it compares the database's alembic revision with the head revision of the installed Dagster,
and each comparison builds a new `ScriptDirectory` that reads all ~90 migration scripts again: about
0.05 s apiece, four times in a run worker, 0.2 s of every run's start-up on 2 cores. The scripts of
the installed Dagster do not change under a running process, so the fork server reads them here, once,
and every run forked from it shares what it read. The database's own revision is still read each time:
a storage that needs a migration is still refused.
"""
from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory
from dagster._core.storage import sql


class _ScriptsReadOnce:
    """Stands in for `ScriptDirectory` in `dagster._core.storage.sql` (its only use there is
    `from_config`, called under Dagster's alembic lock)."""

    _directories: dict[tuple[str | None, str | None], ScriptDirectory] = {}

    @classmethod
    def from_config(cls, config: Config) -> ScriptDirectory:
        key = (config.config_file_name, config.get_main_option("script_location"))
        if key not in cls._directories:
            cls._directories[key] = ScriptDirectory.from_config(config)
        return cls._directories[key]


def _warm() -> None:
    try:
        from dagster._core.storage.event_log.sqlite import sqlite_event_log
        from dagster._core.storage.runs.sqlite import sqlite_run_storage
        from dagster._core.storage.schedules.sqlite import sqlite_schedule_storage

        for module in (sqlite_run_storage, sqlite_event_log, sqlite_schedule_storage):
            _ScriptsReadOnce.from_config(sql.get_alembic_config(module.__file__)).as_revision_number("head")
    except Exception:  # noqa: BLE001 - another Dagster's internals: its own checks stay as they are
        return
    sql.ScriptDirectory = _ScriptsReadOnce


_warm()
