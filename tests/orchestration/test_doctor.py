"""`feedapi-dagster doctor` on real Dagster instances (a DAGSTER_HOME folder each), run as a user runs
it: the console command, its output and its exit code."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import yaml

from feedapi_dagster.orchestration.demo_commands import INSTANCE_TEMPLATE
from feedapi_dagster.orchestration.doctor import instance_findings

COMMAND = str(Path(sys.executable).with_name("feedapi-dagster"))


def doctor(home: Path | None, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    if home is not None:
        env["DAGSTER_HOME"] = str(home)
    return subprocess.run([COMMAND, "doctor", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def missing(output: str) -> list[str]:
    return [line.split()[1] for line in output.splitlines() if line.strip().startswith("MISSING")]


def test_an_instance_without_the_settings_is_told_what_it_lacks_and_why(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # a user's own, without the settings
    result = doctor(home)
    assert result.returncode == 1, result.stdout + result.stderr
    assert missing(result.stdout) == [
        "concurrency.pools.default_limit:",
        "concurrency.runs.tag_concurrency_limits:",
        "run_monitoring:",
    ], result.stdout
    assert "every later load of the feed waits in the queue for good" in result.stdout
    assert "3 setting(s) missing" in result.stdout and INSTANCE_TEMPLATE.read_text() in result.stdout
    # --write-config leaves a user's own dagster.yaml as it is
    assert doctor(home, "--write-config").returncode == 1
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"

    # the settings added by hand, from the shipped file: nothing missing
    shipped = yaml.safe_load(INSTANCE_TEMPLATE.read_text())
    (home / "dagster.yaml").write_text(
        yaml.safe_dump(
            {
                "telemetry": {"enabled": False},
                "concurrency": shipped["concurrency"],
                "run_monitoring": shipped["run_monitoring"],
            }
        )
    )
    result = doctor(home)
    assert result.returncode == 0 and missing(result.stdout) == [], result.stdout
    assert result.stdout.rstrip().endswith("the instance has what feed loads need")


def test_write_config_sets_up_an_empty_dagster_home(tmp_path):
    home = tmp_path / "new_home"
    result = doctor(home)
    assert result.returncode == 1 and "is no folder" in result.stdout
    result = doctor(home, "--write-config")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {home / 'dagster.yaml'}" in result.stdout
    assert (home / "dagster.yaml").read_text() == INSTANCE_TEMPLATE.read_text()
    with dg.DagsterInstance.from_config(str(home)) as instance:  # what Dagster itself reads from it
        assert all(finding.ok for finding in instance_findings(instance))
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1


def test_without_dagster_home_it_checks_the_folder_dg_dev_would_configure_from(tmp_path):
    result = doctor(None, cwd=tmp_path)
    assert result.returncode == 1 and "DAGSTER_HOME is not set" in result.stdout
    assert len(missing(result.stdout)) == 3
    (tmp_path / "dagster.yaml").write_text(INSTANCE_TEMPLATE.read_text())  # `dg dev` reads the project's own
    result = doctor(None, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert doctor(None, "--write-config", cwd=tmp_path).returncode == 1  # where to write it: not said


def test_dagster_home_from_the_projects_env_file_as_dg_dev_reads_it(tmp_path):
    project = tmp_path / "my-feeds"
    project.mkdir()
    (project / ".env").write_text(f"DAGSTER_HOME={project / '.dagster'}\n")
    result = doctor(None, "--write-config", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / ".dagster" / "dagster.yaml").read_text() == INSTANCE_TEMPLATE.read_text()
    assert f"DAGSTER_HOME {project / '.dagster'}" in result.stdout


def test_the_old_limit_on_dagster_partition_is_enough_with_a_line_saying_it_holds_other_feeds(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # the dagster.yaml shipped before issue 35: one run per partition key, whatever its feed
    (home / "dagster.yaml").write_text(
        INSTANCE_TEMPLATE.read_text().replace('key: "feedapi/partition"', 'key: "dagster/partition"')
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        findings = {finding.setting.split(":")[0]: finding for finding in instance_findings(instance)}
    limit = findings["concurrency.runs.tag_concurrency_limits"]
    assert limit.ok and "partition 0 of two feeds wait for each other" in limit.said
    assert "the key feedapi/partition limits runs per feed" in limit.said
