"""The fork server's storage warm-up: Dagster's migration scripts read once, every database still checked."""
import os
import subprocess
import sys
import textwrap

from feedapi_dagster.orchestration.launcher import ForkServerRunLauncher

# In a process of its own: the warm-up changes Dagster's storage module for the whole process, as it
# does in the fork server (and so in every run forked from it).
SCRIPT = textwrap.dedent('''
    import json, uuid
    import dagster as dg
    from alembic.script import ScriptDirectory
    from dagster._core.storage import sql
    from dagster._core.storage.runs.sqlite import sqlite_run_storage

    config = sql.get_alembic_config(sqlite_run_storage.__file__)
    head = ScriptDirectory.from_config(config).get_current_head()
    older = ScriptDirectory.from_config(config).get_revision(head).down_revision

    run_id = str(uuid.uuid4())
    with dg.DagsterInstance.get() as instance:  # the daemon made the storages and the run's shard before
        instance.all_logs(run_id)

    import feedapi_dagster.orchestration.warm_storage as warm

    reads = []
    load_revisions = ScriptDirectory._load_revisions
    def counted(self):
        reads.append(self.dir)
        yield from load_revisions(self)
    ScriptDirectory._load_revisions = counted

    with dg.DagsterInstance.get() as instance:  # what a run worker opens: the instance's storages ...
        instance.all_logs(run_id)  # ... and its run's event-log shard, each checked against the head
        current = instance.run_storage.alembic_version()
        checked_reads = list(reads)
        with instance.run_storage.connect() as conn:  # the database falls behind the installed Dagster
            sql.stamp_alembic_rev(config, conn, older)
        behind = instance.run_storage.alembic_version()
    print(json.dumps({"patched": sql.ScriptDirectory is warm._ScriptsReadOnce, "reads": checked_reads, "head": head,
                      "older": older, "current": current, "behind": behind}))
''')


def test_the_warm_up_reads_the_scripts_once_and_still_reads_each_databases_revision(tmp_path):
    import json

    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["patched"]
    assert found["reads"] == []  # opening the instance and a run shard read no migration script again
    assert found["current"] == [found["head"], found["head"]]
    assert found["behind"] == [found["older"], found["head"]]  # a database behind is still seen as behind


def _exit_0_if_the_storage_is_warm() -> None:
    from dagster._core.storage import sql

    sys.exit(0 if sql.ScriptDirectory.__name__ == "_ScriptsReadOnce" else 3)


def test_what_the_launcher_forks_finds_the_storage_warmed_by_the_fork_server():
    launcher = ForkServerRunLauncher(preload_modules=["dagster"])  # a configured list: the warm-up stays
    launcher.start_fork_server()
    try:
        worker = launcher._context.Process(target=_exit_0_if_the_storage_is_warm)
        worker.start()
        worker.join(120)
        assert worker.exitcode == 0
    finally:
        launcher.dispose()
