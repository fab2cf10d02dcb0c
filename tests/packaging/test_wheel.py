"""The package as users get it: the wheel built from this repository, installed with its declared
dependencies (no extras) into a fresh virtualenv, runs `feedapi-dagster demo` from an empty directory.

The wheel is built from a clean copy of the working tree (tracked and untracked files, not the ignored
ones) with plain `uv build`: a source distribution, then the wheel from it, as a release would. Building
in the repository itself would leave a `build/` folder there whose stale modules setuptools puts into
later wheels.

The install reaches PyPI only, and nothing is compiled: it runs with no compiler on PATH (no cargo,
rustc, cc), so a dependency that needed one would fail it. pyspark is published as a source
distribution only; it builds into a pure-Python wheel. The install first tries uv's cache alone
(`--offline`: ~2 s instead of ~60 s of downloading and building pyspark's 450 MB sdist again, which uv
does whenever PyPI's responses reach it without cache headers), then PyPI; the README's quick start
likewise runs with UV_OFFLINE first, then again from PyPI if its `uv add` needs something uncached. The Delta jars come from
the cache `make setup` made: nothing is resolved from Maven.
"""

from __future__ import annotations

import ast
import contextlib
import email.message
import email.parser
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from feedapi_dagster.spark.connect_server import port_open
from feedapi_dagster.spark.jars import MANIFEST_NAME, jars_dir
from tests.ports import find_free_port

from ..spark_processes import connect_server_pid

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "feedapi_dagster"
SCRIPT = "feedapi-dagster"
UV = Path(sys.executable).with_name("uv")
EVENTS = 600
DEMO_TIMEOUT = 600.0


def _run(
    command: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None, what: str
) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{what} did not finish in {timeout:.0f} s: {' '.join(command)}\n"
            f"--- stdout ---\n{_text(exc.stdout)[-4000:]}\n--- stderr ---\n{_text(exc.stderr)[-4000:]}"
        )
    if result.returncode != 0:
        pytest.fail(
            f"{what} failed (exit code {result.returncode}): {' '.join(command)}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _normalise(name: str) -> str:
    """PEP 503."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _copy_source(destination: Path) -> Path:
    """The working tree without what git ignores (.venv, caches, egg-info, build output)."""
    listing = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        timeout=60,
        what="listing the repository's files",
    )
    for name in filter(None, listing.stdout.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")  # one build for the module's tests: keep every test of the wheel here
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert UV.is_file(), f"uv not found at {UV}: run `make setup`"
    root = tmp_path_factory.mktemp("wheel-build")
    source = _copy_source(root / "source")
    dist = root / "dist"
    _run(
        [str(UV), "build", "--out-dir", str(dist), str(source)],
        cwd=root,
        timeout=300,
        what="`uv build` (sdist, then the wheel from it)",
    )
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}, found {[w.name for w in wheels]}"
    return wheels[0]


def _wheel_metadata(archive: zipfile.ZipFile) -> tuple[str, email.message.Message]:
    dist_infos = {name.split("/", 1)[0] for name in archive.namelist() if name.split("/", 1)[0].endswith(".dist-info")}
    assert len(dist_infos) == 1, f"expected one .dist-info folder in the wheel, found {sorted(dist_infos)}"
    dist_info = dist_infos.pop()
    metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    return dist_info, metadata


def _required_distributions(metadata: email.message.Message) -> set[str]:
    """The distributions the wheel requires without extras (Requires-Dist lines without `extra ==`)."""
    required = set()
    for requirement in metadata.get_all("Requires-Dist") or []:
        if re.search(r"""\bextra\s*==""", requirement):
            continue
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert name, f"unparsable Requires-Dist: {requirement!r}"
        required.add(_normalise(name.group(1)))
    return required


def _imported_modules(archive: zipfile.ZipFile) -> dict[str, set[str]]:
    """Third-party top-level module -> the wheel's files that import it (absolute imports, anywhere
    in a file: module level, functions, TYPE_CHECKING blocks)."""
    imported: dict[str, set[str]] = {}
    for name in archive.namelist():
        if not name.endswith(".py"):
            continue
        tree = ast.parse(archive.read(name), filename=name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".", 1)[0]
                if top not in sys.stdlib_module_names and top != PACKAGE:
                    imported.setdefault(top, set()).add(name)
    return imported


def test_wheel_holds_the_package_its_data_and_declares_what_it_imports(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        dist_info, metadata = _wheel_metadata(archive)
        top_level = {name.split("/", 1)[0] for name in archive.namelist()}
        assert top_level == {PACKAGE, dist_info}, (
            f"the wheel's top level must be only {PACKAGE}/ and {dist_info}/, found {sorted(top_level)}"
        )
        assert f"{PACKAGE}/demo/dagster.yaml" in archive.namelist(), (
            f"{PACKAGE}/demo/dagster.yaml (package data for `feedapi-dagster demo`/`dev`) is not in the wheel"
        )
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        assert re.search(rf"^{SCRIPT}\s*=\s*{PACKAGE}\.cli:main\s*$", entry_points, re.M), (
            f"no `{SCRIPT}` console script in the wheel's entry_points.txt:\n{entry_points}"
        )
        required = _required_distributions(metadata)
        imported = _imported_modules(archive)

    assert imported, "no third-party import found in the wheel: the scan is broken"
    provided_by = importlib.metadata.packages_distributions()
    not_installed, undeclared = [], []
    for module, files in sorted(imported.items()):
        distributions = {_normalise(d) for d in provided_by.get(module, [])}
        where = ", ".join(sorted(files)[:3]) + (" ..." if len(files) > 3 else "")
        if not distributions:
            not_installed.append(f"{module} (imported in {where})")
        elif not distributions & required:
            undeclared.append(f"{module} from {'/'.join(sorted(distributions))} (imported in {where})")
    assert not not_installed, (
        "modules the package imports that no distribution of the test environment provides, so they "
        "cannot be checked against Requires-Dist: " + "; ".join(not_installed)
    )
    assert not undeclared, (
        "modules the package imports whose distribution is not a declared dependency (Requires-Dist "
        f"without extras: {sorted(required)}); declare them in pyproject.toml: " + "; ".join(undeclared)
    )


def _install(python: Path, wheel: Path, *, cwd: Path) -> None:
    """`uv pip install <wheel>` (no extras) with no compiler reachable: only the virtualenv's bin on
    PATH, no CC/CXX/RUSTC/CARGO."""
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "RUSTC", "CARGO", "VIRTUAL_ENV")}
    env["PATH"] = str(python.parent)
    command = [str(UV), "pip", "install", "--python", str(python), str(wheel)]
    cached = subprocess.run([*command, "--offline"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if cached.returncode != 0:  # something not in uv's cache yet: from PyPI
        _run(
            command,
            cwd=cwd,
            env=env,
            timeout=900,
            what="installing the wheel into a new virtualenv (PyPI; no compiler on PATH)",
        )


@pytest.mark.spark
def test_installed_wheel_runs_the_demo_from_an_empty_directory(wheel: Path, tmp_path: Path) -> None:
    jars = jars_dir()
    manifest = jars / MANIFEST_NAME
    assert manifest.is_file(), f"the Delta jar cache {jars} is not set up (no {MANIFEST_NAME}): run `make setup`"
    manifest_stamp = manifest.stat().st_mtime_ns

    # a fresh virtualenv with the wheel and its dependencies, wheels only (nothing compiled)
    venv = tmp_path / "venv"
    _run(
        [str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=tmp_path, timeout=120, what="`uv venv`"
    )
    python = venv / "bin" / "python"
    _install(python, wheel, cwd=tmp_path)
    script = venv / "bin" / SCRIPT
    assert script.is_file(), f"installing the wheel made no {script}"

    workdir = tmp_path / "empty"
    workdir.mkdir()
    scratch = tmp_path / "scratch"  # TMPDIR: the Spark server's work dir, token and lock files
    scratch.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DAGSTER_HOME",
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "PYTHONHOME",
            "SPARK_HOME",
            "SPARK_REMOTE",
            "SPARK_CONNECT_MODE_ENABLED",
            "PYSPARK_SUBMIT_ARGS",
            "PYSPARK_PYTHON",
        )
        and not k.startswith("FEEDAPI_DAGSTER_")
    }
    env.update(FEEDAPI_DAGSTER_JARS_DIR=str(jars), TMPDIR=str(scratch))

    # the installed copy is the one that runs, not this repository's
    located = _run(
        [str(python), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
        cwd=workdir,
        env=env,
        timeout=120,
        what=f"importing {PACKAGE} in the new virtualenv",
    )
    assert Path(located.stdout.strip()).is_relative_to(venv), (
        f"the new virtualenv imports {PACKAGE} from {located.stdout.strip()}, not from its site-packages"
    )

    feed_port, spark_port = find_free_port(), find_free_port()
    while spark_port == feed_port:
        spark_port = find_free_port()
    command = [
        str(script),
        "demo",
        "--events",
        str(EVENTS),
        "--partitions",
        "2",
        "--feed-port",
        str(feed_port),
        "--spark-port",
        str(spark_port),
    ]
    try:
        result = _run(command, cwd=workdir, env=env, timeout=DEMO_TIMEOUT, what=f"`{SCRIPT} demo`")
        left_running = port_open(spark_port)
    finally:
        # a demo that failed or timed out may leave its (detached) Spark Connect server behind
        pid = connect_server_pid(spark_port)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)  # its own session: the JVM and its Python workers
            except ProcessLookupError:
                pass

    assert not left_running, f"the Spark Connect server the demo started still listens on port {spark_port}"
    total = re.search(r"^\s*total\s+(\d+)\s*$", result.stdout, re.M)
    assert total, f"no `total` row in the demo's output:\n{result.stdout[-4000:]}"
    assert int(total.group(1)) == EVENTS, f"the demo loaded {total.group(1)} events, not {EVENTS}:\n{result.stdout}"
    # the log starts clean: no Dagster BetaWarning (backfill_policy), no pyspark FutureWarning (pandas 3)
    warned = [line for line in (result.stdout + result.stderr).splitlines() if "Warning" in line]
    assert not warned, "the demo's output has warnings:\n" + "\n".join(warned[:10])
    assert (workdir / "lakehouse" / "demo" / "_delta_log").is_dir(), "no Delta table at ./lakehouse/demo"
    assert (workdir / ".dagster_home" / "dagster.yaml").is_file(), "no ./.dagster_home/dagster.yaml"
    assert {p.name for p in workdir.iterdir()} == {"lakehouse", ".dagster_home"}, (
        f"the demo left other files in its directory: {sorted(p.name for p in workdir.iterdir())}"
    )
    # the cached jars were used as they are: nothing resolved again, nothing cached in the new virtualenv
    assert manifest.stat().st_mtime_ns == manifest_stamp, f"the Delta jar cache {jars} was rewritten"
    assert not (venv / "share" / "feedapi-dagster").exists(), "the demo set up a jar cache in the new virtualenv"


QUICKSTART_MARK = "<!-- quickstart -->"
README_FEED_PORT = "8765"
SCAFFOLD_LINE = "dg scaffold defs feedapi_dagster.FeedApiComponent orders_feed"


def quickstart_block() -> str:
    """The README's quick start: the bash block after its `<!-- quickstart -->` mark."""
    readme = (REPO / "README.md").read_text()
    assert QUICKSTART_MARK in readme, f"README.md has no {QUICKSTART_MARK} mark before its quick start"
    block = re.search(r"```bash\n(.*?)```", readme[readme.index(QUICKSTART_MARK) :], re.S)
    assert block, f"no ```bash block after {QUICKSTART_MARK} in README.md"
    return block.group(1)


@pytest.mark.spark
def test_the_readme_quick_start_pasted_in_an_empty_folder_loads_a_partition(wheel: Path, tmp_path: Path) -> None:
    """The quick start as written, from `uv init` to the loaded partition, with the suite's wheel as
    FEEDAPI_WHEEL. Two edits, for a shared machine: the demo feed's port is a free one, and the
    scaffolded defs.yaml gets a free Spark port (the README's embedded server takes the default)."""
    jars = jars_dir()
    assert (jars / MANIFEST_NAME).is_file(), f"the Delta jar cache {jars} is not set up: run `make setup`"
    feed_port, spark_port = find_free_port(), find_free_port()
    while spark_port == feed_port:
        spark_port = find_free_port()
    script = quickstart_block()
    assert script.count(README_FEED_PORT) == 2 and script.count(SCAFFOLD_LINE) == 1, script
    script = script.replace(README_FEED_PORT, str(feed_port))
    scaffold = next(line for line in script.splitlines() if SCAFFOLD_LINE in line)
    script = script.replace(
        scaffold,
        f"{scaffold}\nsed -i 's/^    mode: embedded$/    mode: embedded\\n    port: {spark_port}/' "
        "src/my_feeds/defs/orders_feed/defs.yaml\ngrep -q 'port: [0-9]' src/my_feeds/defs/orders_feed/defs.yaml",
    )

    # what a new user's shell has: uv, Java and the system's tools; nothing of this repository's venv
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "uv").symlink_to(UV)
    scratch = tmp_path / "scratch"  # TMPDIR: the Spark server's work dir, token and lock files
    scratch.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DAGSTER_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SPARK_HOME", "SPARK_REMOTE")
        and not k.startswith(("FEEDAPI_DAGSTER_", "PYSPARK_", "UV_", "ORDERS_"))
    }
    env.update(
        PATH=f"{tools}:/usr/local/bin:/usr/bin:/bin",
        FEEDAPI_WHEEL=str(wheel),
        FEEDAPI_DAGSTER_JARS_DIR=str(jars),  # `setup-jars` finds them set up: nothing from Maven
        TMPDIR=str(scratch),
    )
    # `uv add` from uv's cache alone first, as `_install` does (~1 s instead of ~20 s of CPU: uv
    # downloads and builds pyspark's sdist again whenever PyPI's answers reach it without cache
    # headers); only if something is not in the cache, the whole quick start again from PyPI
    workdir = tmp_path / "empty"
    returncode, output = _run_quickstart(script, {**env, "UV_OFFLINE": "1"}, workdir, spark_port)
    if returncode != 0 and OFFLINE_MISS in output:  # something not in uv's cache yet: from PyPI
        workdir = tmp_path / "empty-online"
        returncode, output = _run_quickstart(script, env, workdir, spark_port)
    assert returncode == 0, f"the quick start failed (exit code {returncode}):\n{output[-8000:]}"
    assert "feed orders: partitions 0, 1" in output, output[-4000:]
    row = re.search(r"^\s*0\s+(\d+)\s+(yes|no)\s+\S+\s*$", output, re.M)
    assert row and int(row.group(1)) > 0, f"no loaded partition 0 in `feedapi-dagster state`:\n{output[-4000:]}"
    # `feedapi-dagster sql`'s table: partition 0's rows, counted by the feed's table name
    printed = re.search(r"^\|\s*0\|\s*(\d+)\|\s*(\d+)\|$", output, re.M)
    assert printed, f"no table printed by `feedapi-dagster sql`:\n{output[-4000:]}"
    assert int(printed.group(1)) > 0 and int(printed.group(2)) == int(printed.group(1)) - 1, output[-4000:]
    project = workdir / "my-feeds"
    assert (project / "lakehouse" / "orders" / "_delta_log").is_dir(), output[-4000:]


# what uv says when a package is not in its cache and the network is disabled (UV_OFFLINE)
OFFLINE_MISS = "the network was disabled"


def _run_quickstart(script: str, env: dict[str, str], workdir: Path, spark_port: int) -> tuple[int, str]:
    """The quick start's exit code and output, run by bash in the empty folder `workdir`; what it left
    running (the demo server, the embedded Spark server on `spark_port`) is killed at the end."""
    workdir.mkdir()
    shell = subprocess.Popen(
        ["bash", "-c", "set -eo pipefail\n" + script],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the demo server it starts in the background is in its group
    )
    try:
        output, _ = shell.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        output, _ = shell.communicate()
        pytest.fail(f"the quick start did not finish in {DEMO_TIMEOUT:.0f} s:\n{output[-6000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        pid = connect_server_pid(spark_port)  # the embedded Spark server the run started, detached
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return shell.returncode, output
