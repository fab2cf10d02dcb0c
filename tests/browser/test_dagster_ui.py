"""The Dagster UI shows a feed as a user's project gets it: demo feed -> real discovery -> a load on
real Spark and Delta -> dagster-webserver -> Chromium.

A demo FeedAPI server publishes 3 partitions; a user's own dg project (tests/user_project.py) has the
feed in one defs.yaml; discovery runs for real over HTTP into a temporary Dagster instance and one
run of the feed's asset loads every partition (the local Spark session of the tests).
Then a backfill of the three partitions, which have nothing new, is recorded as the UI launches one
and run by `dagster-daemon` (its backfill loop, the run queue, a run process of its own).
`dagster-webserver` serves the project against that instance; headless Chromium opens the asset's
page and must show the partition keys 0, 1 and 2 materialized, the sensor and schedule that load it,
Dagster's standard table metadata (row count, columns, storage URI), the loads' figures plotted per
partition (the metadata's Plots toggle), the checks of the load passed,
the backfill completed with its three partitions succeeded, and the asset's last sync (the load's
observation: `last_synced`, partitions synced).

Needs Debian's chromium and chromium-driver: `make browser` installs them (the test fails, never
skips, without them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

import feedapi_dagster.demo
from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.orchestration import FeedConfig, ProjectConfig
from feedapi_dagster.orchestration.automation import load_request, register_discovered_partitions
from feedapi_dagster.orchestration.loads import FeedBinding

from ..backfills import launch_backfill, running_daemon, wait_for_backfill
from ..user_project import importable, write_user_project

INSTANCE_TEMPLATE = Path(feedapi_dagster.demo.__file__).with_name("dagster.yaml")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WEBSERVER = Path(sys.executable).parent / "dagster-webserver"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
]
SERVER_START_TIMEOUT = 90  # dagster-webserver + its code server take 20-40 s on a 2-core machine
PAGE_TIMEOUT = 45
EXPECTED_KEYS = ["0", "1", "2"]
# numeric metadata of each partition's latest materialization, drawn by the metadata's Plots toggle
PLOTTED = ["events", "read_seconds", "load_seconds", "pages"]


def _require_browser():
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: run `make browser` (installs the Debian packages "
            "chromium and chromium-driver) before the browser tests",
            pytrace=False,
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail("selenium is not installed: run `make setup` (it is in the `test` extra)", pytrace=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_server(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dagster-webserver exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(
        f"dagster-webserver did not answer /server_info within {SERVER_START_TIMEOUT} s:\n{log.read_text()[-4000:]}"
    )


def _stop(process: subprocess.Popen) -> None:
    """Terminate the webserver and the code server it spawned (its own process group), then kill."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@pytest.fixture
def feed_server():
    with DemoFeedServer(DemoFeed(partitions=3, events=200), dialect="published", port=0) as server:
        yield server


@pytest.fixture
def user_project(tmp_path, feed_server, monkeypatch) -> Path:
    """A user's dg project with the feed in one defs.yaml (Spark: this process's local session)."""
    # the sensor and the schedule stopped: the daemon runs the backfill only
    root = write_user_project(
        tmp_path / "project",
        feed_server.url,
        {"mode": "local"},
        lakehouse=tmp_path / "lakehouse",
        feed={"schedule": {"enabled": False, "discovery_enabled": False}},
    )
    monkeypatch.setenv("ORDERS_FEED_TOKEN", "unused-by-the-demo-server")
    with importable(root):
        yield root


@pytest.fixture
def dagster_home(tmp_path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(INSTANCE_TEMPLATE, home / "dagster.yaml")
    # what the UI's "Skip" on its one-time community pop-up records (dagster._core.nux): without it
    # the pop-up covers the page
    (home / ".nux").mkdir()
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    return home


def _discover_and_load(project: Path, home: Path, feed_url: str) -> list[str]:
    """Real discovery over HTTP into the instance at `home`, then one load of every partition: a run
    of the feed's asset job, on real Spark and Delta, with its checks."""
    from dagster._core.instance.ref import InstanceRef

    defs = dg.load_from_defs_folder(path_within_project=project)
    key = dg.AssetKey(["feedapi", "orders"])
    feed = FeedConfig(name="orders", url=feed_url, dialect="published")
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        binding = FeedBinding(ProjectConfig(lakehouse=str(project.parent / "lakehouse"), feeds=[feed]), feed, key)
        keys = register_discovered_partitions(instance, binding)
        request = load_request(binding, [int(k) for k in keys], "browser-test", keys)
        result = defs.resolve_job_def("feedapi_orders_load").execute_in_process(
            instance=instance, tags=request.tags, run_config=request.run_config
        )
        assert result.success
        return keys


def _chrome(user_data_dir: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


# Visible leaf elements of the page with their rendered text and position (what a user sees).
_OWN_TEXTS = """
const out = [];
for (const el of document.querySelectorAll('body *')) {
  if (!el.offsetParent) continue;
  // the element's own text (a partition key sits beside its status dot, not in a leaf of its own)
  const text = Array.from(el.childNodes).filter(n => n.nodeType === Node.TEXT_NODE)
    .map(n => n.textContent).join('').trim();
  const rect = el.getBoundingClientRect();
  if (text && rect.width > 0 && rect.height > 0) out.push({text: text, x: rect.left, y: rect.top});
}
return out;
"""
COMMUNITY_DIALOG = "Join the Dagster community"


@pytest.mark.browser
def test_the_asset_page_shows_partitions_automations_checks_and_table_metadata(
    spark, tmp_path, user_project, dagster_home, feed_server
):
    _require_browser()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        _check_the_ui(stack, started, tmp_path, user_project, dagster_home, feed_server)


def _check_the_ui(
    stack: contextlib.ExitStack,
    started: float,
    tmp_path: Path,
    user_project: Path,
    dagster_home: Path,
    feed_server: DemoFeedServer,
) -> None:
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.instance.ref import InstanceRef

    assert _discover_and_load(user_project, dagster_home, feed_server.url) == EXPECTED_KEYS
    # the three partitions have nothing new: a backfill of them, as the UI launches it, run by the daemon
    instance = stack.enter_context(dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home))))
    daemon_log = tmp_path / "daemon.log"
    daemon = stack.enter_context(running_daemon(user_project, dagster_home, daemon_log))
    backfill_id = launch_backfill(instance, user_project, dg.AssetKey(["feedapi", "orders"]), EXPECTED_KEYS)

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(DAGSTER_HOME=str(dagster_home), ORDERS_FEED_TOKEN="unused-by-the-demo-server")
    log = tmp_path / "webserver.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [str(WEBSERVER), "-h", "127.0.0.1", "-p", str(port), "-w", str(user_project / "workspace.yaml")],
            cwd=user_project,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    driver = None
    try:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import WebDriverWait

        # Chromium starts while the webserver loads the code location and the daemon runs the backfill
        driver = _chrome(str(tmp_path / "chromium-profile"))  # a fresh profile
        _wait_for_server(server, url, log)
        backfill = wait_for_backfill(instance, backfill_id, daemon, daemon_log)
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, daemon_log.read_text()[-3000:]
        served = time.monotonic()

        def page(path: str, wanted: list[str], name: str, own: tuple[str, ...] = ()) -> tuple[list[dict], str]:
            """Open `path`, wait until every text of `wanted` is visible (and each of `own` is the
            whole text of an element: "0" is in "Failed (0)" long before the partition 0 is listed);
            the elements' own texts and the body text."""
            driver.get(f"{url}{path}")
            screenshot = tmp_path / f"{name}.png"

            def rendered(drv):
                leaves = drv.execute_script(_OWN_TEXTS)
                texts = {leaf["text"] for leaf in leaves}
                if COMMUNITY_DIALOG in texts:  # only if the pre-seeded "seen" flag was not honoured
                    for button in drv.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
                        button.click()
                    return False
                body = drv.find_element(By.TAG_NAME, "body").text
                return leaves if all(text in body for text in wanted) and set(own) <= texts else False

            try:
                leaves = WebDriverWait(driver, PAGE_TIMEOUT, poll_frequency=0.5).until(rendered)
            except TimeoutException:
                driver.save_screenshot(str(screenshot))
                body = driver.find_element(By.TAG_NAME, "body").text
                pytest.fail(
                    f"{path} did not show {wanted} within {PAGE_TIMEOUT} s (screenshot {screenshot}); "
                    f"page text:\n{body[:4000]}"
                )
            assert driver.save_screenshot(str(screenshot))
            body = driver.find_element(By.TAG_NAME, "body").text
            assert COMMUNITY_DIALOG not in body, f"a dialog covers {path}"
            return leaves, body

        def log_shows(filters: list[tuple[str, str]], name: str) -> None:
            """The open run page's log list, filtered by each query as a user looks for a line (it shows
            its newest lines), shows the text wanted."""
            box = driver.find_element(By.XPATH, "//*[starts-with(@placeholder, 'Filter')]")
            for query, wanted in filters:
                box.send_keys(Keys.CONTROL, "a")  # a React input: `clear()` leaves its state as it was
                box.send_keys(Keys.DELETE)
                box.send_keys(query)
                try:
                    WebDriverWait(driver, PAGE_TIMEOUT, poll_frequency=0.5).until(
                        lambda drv, wanted=wanted: wanted in drv.find_element(By.TAG_NAME, "body").text
                    )
                except TimeoutException:
                    driver.save_screenshot(str(tmp_path / f"{name}-filtered.png"))
                    pytest.fail(f"the run's log did not show {wanted!r} (screenshot {name}-filtered.png)")

        # partitions: the discovered keys, one column in order, all materialized by the load
        leaves, body = page(
            "/assets/feedapi/orders?view=partitions", ["3 Partitions Selected"], "partitions", own=tuple(EXPECTED_KEYS)
        )
        rows = {
            key: min((leaf for leaf in leaves if leaf["text"] == key), key=lambda leaf: leaf["y"])
            for key in EXPECTED_KEYS
        }
        assert rows["0"]["y"] < rows["1"]["y"] < rows["2"]["y"], rows
        assert "Materialized (3)" in body, body[:3000]

        # overview: the schedule and the sensor that load it, the table's standard metadata
        _, body = page(
            "/assets/feedapi/orders", ["Automation details", "feedapi_orders_discovery", "Every 5 minutes"], "overview"
        )
        lines = body.splitlines()
        # Dagster's standard metadata: the row count (dagster/row_count), the columns, the table's URI
        assert lines[lines.index("Row count") + 1] == str(sum(len(feed_server.feed.published(p)) for p in range(3)))
        assert {"Columns", "partition_id", "event_id", "Storage", "feedapi_orders_load"} <= set(lines), body[:4000]
        # plots, not the table (Dagster 1.13 has no Plots tab: the overview's metadata table has a Table/Plots toggle, which
        # for a partitioned asset plots each partition's latest materialization): a plot per load figure
        plots = driver.find_element(By.XPATH, "//button[normalize-space()='Plots']")
        driver.execute_script("arguments[0].scrollIntoView(); arguments[0].click();", plots)
        try:
            WebDriverWait(driver, PAGE_TIMEOUT, poll_frequency=0.5).until(
                lambda drv: (
                    "Table" in drv.find_element(By.TAG_NAME, "body").text
                    and all(drv.find_elements(By.XPATH, f"//*[normalize-space()='{name}']") for name in PLOTTED)
                    and not drv.find_elements(By.XPATH, "//tbody//td[normalize-space()='load_seconds']")
                )
            )
        finally:
            driver.save_screenshot(str(tmp_path / "plots.png"))
        # checks: the three checks of a FeedAPI feed's load, passed
        _, body = page(
            "/assets/feedapi/orders?view=checks",
            ["positions_contiguous", "no_duplicate_event_ids", "cursor_metadata_matches_delta"],
            "checks",
        )
        lines = body.splitlines()
        for check in ("no_duplicate_event_ids", "positions_contiguous"):  # the blocking ones, passed
            assert lines[lines.index(check) + 1] == "Succeeded", body[:3000]
        # a FeedAPI feed has no check of events expired unread (its protocol reports no retention gaps)
        assert "Checks (3)" in lines and "Passed" in lines and "no_events_expired_unread" not in body, body[:3000]

        # the backfill of partitions with nothing new: succeeded (it ended COMPLETED_FAILED when its run
        # logged no materialization for them)
        _, body = page(f"/runs/b/{backfill_id}", [backfill_id, "Status"], "backfill")
        lines = body.splitlines()
        assert lines[lines.index("Status") + 1] == "Succeeded", body[:3000]
        # the asset's last sync: the observation of every load (when, how many partitions, what it brought),
        # the newest first in its events
        (run,) = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        _, body = page(
            "/assets/feedapi/orders?view=events", ["last_synced", f"Observed in run {run.run_id[:8]}"], "events"
        )
        lines = body.splitlines()
        assert re.fullmatch(r"\w{3} \d{1,2}, \d{1,2}:\d{2}:\d{2} [AP]M UTC", lines[lines.index("last_synced") + 1]), (
            body
        )
        assert lines[lines.index("partitions_synced") + 1] == "3", body[:3000]
        assert lines[lines.index("partitions_with_new_events") + 1] == "0", body[:3000]

        # the feed's stream job (it materializes the partitions it moved): by default its run reads the
        # backlog by a batch load, and its page's log says so
        feed_server.feed.append(30)
        defs = dg.load_from_defs_folder(path_within_project=user_project)
        job = defs.resolve_job_def("feedapi_orders_stream")
        caught_up = job.execute_in_process(instance=instance)
        assert caught_up.success
        page(f"/runs/{caught_up.run_id}", ["RUN_SUCCESS", "feedapi_orders_stream_op"], "stream-catch-up-run")
        log_shows([("caught up", "caught up by a batch load: 30 events of partitions")], "stream-catch-up-run")

        # with `catch_up: false` it runs micro-batches: its page's log says where the stream started and
        # what each micro-batch did
        feed_server.feed.append(30)
        stream = job.execute_in_process(
            instance=instance, run_config={"ops": {"feedapi_orders_stream_op": {"config": {"catch_up": False}}}}
        )
        assert stream.success
        moved = stream.get_asset_materialization_events()
        events = sum(e.materialization.metadata["events"].value for e in moved)
        assert moved and events >= 30
        page(f"/runs/{stream.run_id}", ["RUN_SUCCESS", "feedapi_orders_stream_op"], "stream-run")
        log_shows(
            [
                ("stream started", "stream started (available_now"),
                ("micro-batch", "micro-batch 0 ran in"),
                ("committed", f"committed {events} events of partitions"),
            ],
            "stream-run",
        )
        print(f"webserver up after {served - started:.1f} s, pages checked after {time.monotonic() - served:.1f} s")
    finally:
        if driver is not None:
            driver.quit()
        _stop(server)
