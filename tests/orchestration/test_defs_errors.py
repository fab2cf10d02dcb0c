"""What `dg check defs` tells the user of a defs.yaml with a wrong value: a value it can check as
written (a feed's name, the lakehouse's scheme) in one line with its file and line, as a misspelt key;
a token whose variable is not set, and a value a template rendered wrong, at its file and line without
pydantic's wrapping; exit code 1 for each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from feedapi_dagster.errors import ProtocolError
from feedapi_dagster.orchestration.component import FeedApiAttributes, FeedApiComponent
from feedapi_dagster.protocol import feed_settings

from ..user_project import MODULE
from .test_component import dg_command


def defs_yaml(root):
    return root / MODULE / "defs" / "feeds" / "defs.yaml"


def line_of(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def dagsters_own_warnings(report: str) -> bool:
    return "PreviewWarning" in report or "return attr if isinstance" in report


def first_lines_of_ours(report: str) -> list[str]:
    """The report's lines less Dagster's own warnings and dg's line for the YAML it validated."""
    return [
        line
        for line in report.splitlines()
        if line.strip() and not dagsters_own_warnings(line) and line != "All component YAML validated successfully."
    ]


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_a_token_whose_variable_is_not_set_is_an_error_naming_the_feed_the_field_and_the_variable(
    user_project, monkeypatch, value
):
    if value is None:
        monkeypatch.delenv("ORDERS_FEED_TOKEN")
    else:
        monkeypatch.setenv("ORDERS_FEED_TOKEN", value)
    path = defs_yaml(user_project)
    checked = dg_command(user_project, "check", "defs", merged=True)
    report = checked.stdout
    assert checked.returncode == 1, report[-3000:]
    plain = (
        "feed 'orders': token '{{ env.ORDERS_FEED_TOKEN }}' is empty: the environment variable ORDERS_FEED_TOKEN "
        "is not set (or empty) where the definitions load. Set it, or write `token_env: ORDERS_FEED_TOKEN` to read "
        "it in the runs; a feed that needs no authentication leaves `token` out"
    )
    # the first line the user reads, before Dagster's report of the code location and its stack trace
    assert first_lines_of_ours(report)[0] == plain, report[-3000:]
    assert f"{path}:{line_of(path, 'token:')} - attributes.feeds.0.token: {plain}" in report, report[-3000:]


@pytest.mark.parametrize("value", ["12345", "0x1F", "1e3", "True", " spaced-token "])
def test_a_token_from_the_environment_is_the_text_it_is_set_to(tmp_path, monkeypatch, value):
    # Dagster renders `{{ env.X }}` natively: 12345 became an int, 0x1F the int 31 ("Input should be a
    # valid string"); the token is the variable's text, as written, and a text no HTTP header can carry
    # (spaces around it: a secret file's line) is refused in one line that does not quote it
    monkeypatch.setenv("ORDERS_FEED_TOKEN", value)
    component = FeedApiComponent.resolve_from_model(
        dg.ResolutionContext.default(),
        FeedApiAttributes.model_validate(
            {
                "feeds": [
                    {"name": "orders", "url": "https://feeds.example.com/o", "token": "{{ env.ORDERS_FEED_TOKEN }}"}
                ]
            }
        ),
    )
    if value.strip() != value:
        with pytest.raises(ProtocolError, match="the bearer token holds a space") as refused:
            component.feeds[0].bearer_token()
        assert value.strip() not in str(refused.value)
    else:
        assert component.feeds[0].bearer_token() == value


@pytest.mark.parametrize(
    "written, variable, said",
    [
        ("'{{ env.ORDERS_FEED_TOKEN }}'", "...", "set ORDERS_FEED_TOKEN to the feed's token"),
        ("'...'", None, "write the feed's token in its place"),
    ],
    ids=["variable", "yaml"],
)
def test_the_placeholder_token_is_refused_in_one_plain_first_line(user_project, monkeypatch, written, variable, said):
    monkeypatch.setenv("ORDERS_FEED_TOKEN", variable or "tok")
    path = defs_yaml(user_project)
    path.write_text(path.read_text().replace("token: '{{ env.ORDERS_FEED_TOKEN }}'", f"token: {written}"))
    checked = dg_command(user_project, "check", "defs", merged=True)
    report = checked.stdout
    assert checked.returncode == 1, report[-3000:]
    template = "{{ env.ORDERS_FEED_TOKEN }}" if variable else "..."
    assert first_lines_of_ours(report)[0] == f"feed 'orders': token '{template}' is '...', a placeholder: {said}", (
        report[-3000:]
    )
    assert "valid string" not in report


def test_a_token_written_as_a_yaml_number_is_one_line_saying_to_quote_it(user_project):
    path = defs_yaml(user_project)
    path.write_text(path.read_text().replace("token: '{{ env.ORDERS_FEED_TOKEN }}'", "token: 0x1F"))
    checked = dg_command(user_project, "check", "defs")
    report = checked.stdout + checked.stderr
    assert checked.returncode == 1, report[-3000:]
    assert (
        f"{path}:{line_of(path, 'token:')} - feedapi_dagster.FeedApiComponent attributes.feeds.0.token "
        "'the token in quotes, as text (YAML reads 12345, 0123 or 0x1F as numbers)' was expected\n"
    ) in report, report
    assert "Stack Trace" not in report and "any of the given schemas" not in report


def test_a_feed_without_authentication_leaves_the_token_out(user_project, monkeypatch):
    monkeypatch.delenv("ORDERS_FEED_TOKEN")
    path = defs_yaml(user_project)
    path.write_text("".join(line for line in path.read_text().splitlines(True) if "token:" not in line))
    checked = dg_command(user_project, "check", "defs")
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]
    with pytest.raises(ValidationError, match="token is empty: a feed that needs no authentication leaves it out"):
        feed_settings(url="https://feeds.example.com/orders", token="")


def test_values_dg_check_can_check_as_written_are_one_line_each_with_file_and_line(user_project):
    path = defs_yaml(user_project)
    path.write_text(
        path.read_text()
        .replace("name: orders", "name: Orders")
        .replace(f"lakehouse: {user_project.parent / 'lakehouse'}", "lakehouse: s3://bucket/lake")
    )
    checked = dg_command(user_project, "check", "defs")
    report = checked.stdout + checked.stderr
    assert checked.returncode == 1
    component = "feedapi_dagster.FeedApiComponent"
    assert (
        f"{path}:{line_of(path, 'name: Orders')} - {component} attributes.feeds.0.name "
        "'Orders' does not match '^[a-z][a-z0-9_]*$'\n"
    ) in report, report
    assert (
        f"{path}:{line_of(path, 'lakehouse:')} - {component} attributes.lakehouse "
        "'s3://bucket/lake' does not match '^s3a://[^/]'\n"
    ) in report, report
    ours = [line for line in report.splitlines() if not dagsters_own_warnings(line)]
    assert len(ours) <= 2 * 12, report  # two errors, each its line and a snippet of the YAML around it
    assert "Stack Trace" not in report and "Traceback" not in report and "pydantic" not in report


def test_a_value_a_template_rendered_wrong_is_reported_at_its_line_without_pydantics_wrapping(
    user_project, monkeypatch
):
    monkeypatch.setenv("ORDERS_FEED_URL", "ftp://feeds.example.com/orders")
    path = defs_yaml(user_project)
    path.write_text(path.read_text().replace("url: http://127.0.0.1:9/feed", "url: '{{ env.ORDERS_FEED_URL }}'"))
    checked = dg_command(user_project, "check", "defs")
    report = checked.stdout + checked.stderr
    assert checked.returncode == 1
    assert (
        f"{path}:{line_of(path, 'url:')} - attributes.feeds.0.url: url must be an http:// or https:// URL\n" in report
    ), report[-3000:]
    assert "errors.pydantic.dev" not in report and "input_value" not in report


def _discover(root, tmp_path) -> subprocess.CompletedProcess:
    """`feedapi-dagster discover` in the project at `root`, as a user runs it there."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(root)}
    command = [str(Path(sys.executable).parent / "feedapi-dagster"), "discover"]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_discover_says_why_a_feed_cannot_be_reached_once_and_whole(user_project, tmp_path):
    # the project's feed is http://127.0.0.1:9/feed: nothing listens there
    found = _discover(user_project, tmp_path)
    assert found.returncode == 1, found.stdout + found.stderr
    said = found.stdout.strip().splitlines()[-1]
    assert said.startswith("feed orders: discovery failed: feed http://127.0.0.1:9/feed: giving up after"), said
    assert said.count("feed orders:") == 1, said
    assert said.endswith("Failed to establish a new connection: [Errno 111] Connection refused"), said


def test_discover_reports_a_misspelt_key_in_one_line_at_its_file_and_line(user_project, tmp_path):
    path = defs_yaml(user_project)
    path.write_text(path.read_text().replace("page_size_hint:", "page_size_hnt:"))
    found = _discover(user_project, tmp_path)
    assert found.returncode == 1, found.stdout + found.stderr
    assert found.stdout.strip() == (
        f"the dg project at {user_project} does not load: attributes.feeds.0.page_size_hnt at "
        f"{path}:{line_of(path, 'page_size_hnt')} Extra inputs are not permitted"
    ), found.stdout
    assert "Traceback" not in found.stdout + found.stderr, found.stderr[-3000:]
