"""The Dagster UI shows a feed's partitions: demo feed -> real discovery -> dagster-webserver -> Chromium.

A demo FeedAPI server publishes 3 partitions; discovery runs for real over HTTP and its dynamic
partitions are added to a temporary Dagster instance; `dagster-webserver` serves the repository's
code location (workspace.yaml) against that instance and the temporary feeds file; headless
Chromium opens the asset's partitions view and must render the keys 0, 1 and 2. No Spark is started.

Needs Debian's chromium and chromium-driver: `make browser` installs them (the test fails, never
skips, without them).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.orchestration import load_config
from feedapi_dagster.orchestration.automation import DiscoveryCursor, evaluate_discovery

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WEBSERVER = Path(sys.executable).parent / "dagster-webserver"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1400,900",
]
SERVER_START_TIMEOUT = 90  # dagster-webserver + its code server take 20-40 s on a 2-core machine
PAGE_TIMEOUT = 45
EXPECTED_KEYS = ["0", "1", "2"]

def _require_browser():
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: run `make browser` (installs the Debian packages "
                    "chromium and chromium-driver) before the browser tests", pytrace=False)
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
    pytest.fail(f"dagster-webserver did not answer /server_info within {SERVER_START_TIMEOUT} s:\n"
                f"{log.read_text()[-4000:]}")


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
def feeds_file(tmp_path, feed_server) -> Path:
    path = tmp_path / "feeds.yaml"
    path.write_text(yaml.safe_dump({
        "lakehouse": str(tmp_path / "lakehouse"),
        "spark": {"mode": "local"},
        "feeds": [{"name": "orders", "url": feed_server.url, "dialect": "published"}],
    }))
    return path


@pytest.fixture
def dagster_home(tmp_path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
    # what the UI's "Skip" on its one-time community pop-up records (dagster._core.nux): without it
    # the pop-up covers the page
    (home / ".nux").mkdir()
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    return home


def _discover_into_instance(feeds_file: Path, home: Path) -> list[str]:
    """Real discovery over HTTP, its dynamic partitions added to the instance at `home`."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    feed = load_config(feeds_file).feed("orders")
    client = feed.client()
    try:
        result = evaluate_discovery(feed, client.discover(), DiscoveryCursor())
    finally:
        client.close()
    assert result.dynamic_partitions_requests, "discovery found no partitions"
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return instance.get_dynamic_partitions("feedapi_orders")


def _chrome(user_data_dir: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


# Visible leaf elements of the page with their rendered text and position (what a user sees).
_VISIBLE_LEAVES = """
const out = [];
for (const el of document.querySelectorAll('body *')) {
  if (el.children.length || !el.offsetParent) continue;
  const text = (el.innerText || '').trim();
  const rect = el.getBoundingClientRect();
  if (text && rect.width > 0 && rect.height > 0) out.push({text: text, x: rect.left, y: rect.top});
}
return out;
"""
COMMUNITY_DIALOG = "Join the Dagster community"


@pytest.mark.browser
def test_partitions_view_shows_discovered_partitions(tmp_path, feeds_file, dagster_home):
    _require_browser()
    started = time.monotonic()

    assert _discover_into_instance(feeds_file, dagster_home) == EXPECTED_KEYS

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("FEEDAPI_LAKEHOUSE", "DAGSTER_HOME")}
    env.update(DAGSTER_HOME=str(dagster_home), FEEDAPI_DAGSTER_CONFIG=str(feeds_file))
    log = tmp_path / "webserver.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [str(WEBSERVER), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
            cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    driver = None
    try:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        # Chromium starts while the webserver loads the code location
        driver = _chrome(str(tmp_path / "chromium-profile"))  # a fresh profile
        _wait_for_server(server, url, log)
        served = time.monotonic()

        driver.get(f"{url}/assets/feedapi/orders?view=partitions")
        screenshot = tmp_path / "dagster_partitions.png"

        def keys_rendered(drv):
            leaves = drv.execute_script(_VISIBLE_LEAVES)
            texts = {leaf["text"] for leaf in leaves}
            if COMMUNITY_DIALOG in texts:  # only if the pre-seeded "seen" flag was not honoured
                for button in drv.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
                    button.click()
                return False
            if "3 Partitions Selected" in texts and all(key in texts for key in EXPECTED_KEYS):
                return leaves
            return False

        try:
            leaves = WebDriverWait(driver, PAGE_TIMEOUT, poll_frequency=0.5).until(keys_rendered)
        except TimeoutException:
            driver.save_screenshot(str(screenshot))
            body = driver.find_element(By.TAG_NAME, "body").text
            pytest.fail(f"the partitions view did not show keys {EXPECTED_KEYS} within {PAGE_TIMEOUT} s "
                        f"(screenshot {screenshot}); page text:\n{body[:3000]}")
        body = driver.find_element(By.TAG_NAME, "body").text
        # the asset's page (breadcrumb Assets > feedapi > orders) on its Partitions tab
        assert "feedapi" in body and "orders" in body, body[:2000]
        assert "Missing (3)" in body, body[:2000]  # discovered, nothing materialized yet
        # the keys form one column of rows, in order: 0 above 1 above 2
        rows = {key: min((leaf for leaf in leaves if leaf["text"] == key), key=lambda leaf: leaf["y"])
                for key in EXPECTED_KEYS}
        assert rows["0"]["y"] < rows["1"]["y"] < rows["2"]["y"], rows
        assert max(r["x"] for r in rows.values()) - min(r["x"] for r in rows.values()) < 5, rows
        assert COMMUNITY_DIALOG not in body, "a dialog covers the partitions view"
        assert driver.save_screenshot(str(screenshot))
        print(f"screenshot: {screenshot}")
        print(f"webserver up after {served - started:.1f} s, partitions rendered after "
              f"{time.monotonic() - served:.1f} s more")
    finally:
        if driver is not None:
            driver.quit()
        _stop(server)
