"""Every code block of README.md and docs/ is run or validated here, so that a block that no longer
matches the code fails the suite (issue 36: docs that cannot rot).

What each fence's language means:
- `python`: run, the blocks of a page in order in one namespace, in a folder of the page's own (the
  docs' `lakehouse/` is that folder's), on the suite's shared Spark session (`spark`), with the feeds'
  example URLs served by the bundled demo servers; `url`, `partition_id` and `my_defs`, which blocks
  use as given, are defined; a DataFrame a block makes must read a row, a streaming query it
  starts is awaited.
- `sql`: each statement run as `feedapi-dagster sql` runs it in a project's folder (the page's folder;
  its feed `orders` a view by that name, a relative ``delta.`lakehouse/orders` `` the folder's), unchanged.
- `yaml`: loaded as what it is: a defs.yaml (`type: ...`) or a part of one (`attributes:`, or the
  attributes' own keys) by the real `FeedApiComponent` (its pydantic attributes, the templates
  rendered, its definitions built); a Dagster instance's dagster.yaml (`docs-test: yaml=instance`) by
  Dagster's instance schema and its storage's own.
- `bash`: each command parsed by the program's own parser without running it (feedapi-dagster's
  argparse parser; `make -n`; a click command with `--help`, which fails on an unknown option or
  subcommand); `export` run; `curl` run against the demo server. A block run whole by another test is
  marked `<!-- docs-test: run-by=<file>::<test> -->`: that test must exist, and read this very block.
- `text`, `console`: output and messages, not run. A block with no language fails the suite, and so
  does an indented (unfenced) code block.

A block's marker is an HTML comment right before its fence: `<!-- docs-test: key=value ... -->`
(`setup=orders_table`: the page's `lakehouse/orders` loaded from the demo feed first).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import markdown
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LANGUAGES = {"python", "sql", "yaml", "bash", "text", "console"}
NOT_RUN = {"text", "console"}
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*docs-test:(?P<spec>[^>]*?)-->\s*\Z")
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        marker = MARK.search(text[: match.start()])
        marks = dict(item.split("=", 1) for item in marker.group("spec").split()) if marker else {}
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group("lang").strip(), match.group("body"), marks))
    return found


# a page whose every block its own test runs (and fails on a block it does not run)
RUN_BY_ITS_OWN_TEST = {
    "docs/getting-started/look-at-the-data.md": (
        "tests/orchestration/test_sql_command.py::test_the_look_at_the_data_pages_blocks_run_in_a_loaded_project"
    ),
    "docs/protocols/adding-a-protocol.md": (
        "tests/protocol/test_protocol_kit.py::test_the_pages_protocol_reads_its_server_and_loads_it_through_spark_connect"
    ),
}
BLOCKS = [
    block for page in PAGES if str(page.relative_to(REPO)) not in RUN_BY_ITS_OWN_TEST for block in blocks_of(page)
]


def of(*languages: str) -> list:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in languages]


def test_the_docs_have_blocks_of_every_kind_and_each_says_its_language() -> None:
    assert {b.lang for b in BLOCKS} >= {"python", "sql", "yaml", "bash", "text"}
    untyped = [f"{b.where} ({b.lang or 'no language'})" for b in BLOCKS if b.lang not in LANGUAGES]
    assert not untyped, f"code blocks without a language this test knows ({sorted(LANGUAGES)}): {untyped}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_code_block_is_fenced(page: Path) -> None:
    """Markdown's own count of code blocks equals the fenced ones: an indented block would go unrun."""
    html = markdown.markdown(page.read_text(), extensions=["fenced_code", "tables"])
    assert html.count("<pre>") == len(blocks_of(page)), (
        f"{page.relative_to(REPO)} has a code block that is not fenced with a language (indented?)"
    )


@pytest.mark.parametrize("page", sorted(RUN_BY_ITS_OWN_TEST))
def test_a_page_left_to_its_own_test_is_read_by_it(page: str) -> None:
    assert_test_exists(RUN_BY_ITS_OWN_TEST[page])
    assert page in (REPO / RUN_BY_ITS_OWN_TEST[page].split("::")[0]).read_text(), f"{page} is not read by its test"


# ------------------------------------------------------------------------------------------ yaml
ENV = {"ORDERS_FEED_TOKEN": "token-1", "NAKADI_TOKEN": "token-2", "MINIO_ACCESS_KEY": "k", "MINIO_SECRET_KEY": "s"}
# a defs.yaml's attributes around a part the docs show alone (a feed's settings, `spark:`, ...)
BASE_ATTRIBUTES = {
    "lakehouse": "lakehouse",
    "spark": {"mode": "embedded"},
    "feeds": [{"name": "orders", "url": "https://feeds.example.com/orders"}],
}


def load_component(attributes: dict, project_root: Path) -> dg.Definitions:
    """What `dg check defs` and a code location do with a defs.yaml's attributes: validate the
    pydantic attributes, render the templates, build the definitions."""
    from feedapi_dagster.orchestration.component import FeedApiAttributes, FeedApiComponent

    context = dg.ComponentTree.for_test().load_context
    component = FeedApiComponent.load(FeedApiAttributes.model_validate(attributes), context)
    component.project_config(project_root)
    return component.build_defs(context)


def validate_instance(config: dict, home: Path) -> None:
    """A dagster.yaml: the shipped one with the block, by Dagster's instance schema (what
    `DagsterInstance.get()` checks first), and the storage block by its class's own schema. Dagster
    exports no validator of an instance's file: these are its internal ones (a test, not the package)."""
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_postgres import DagsterPostgresStorage

    shipped = yaml.safe_load((REPO / "feedapi_dagster" / "demo" / "dagster.yaml").read_text())
    (home / "dagster.yaml").write_text(yaml.safe_dump({**shipped, **config}))
    dagster_instance_config(str(home))
    if "postgres" in config.get("storage", {}):
        result = validate_config(DagsterPostgresStorage.config_type(), config["storage"]["postgres"])
        assert result.success, [error.message for error in result.errors]


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml_block_loads(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    document = yaml.safe_load(block.body)
    assert isinstance(document, dict), f"{block.where}: not a YAML mapping"
    if block.marks.get("yaml") == "instance":
        validate_instance(document, tmp_path)
    elif "type" in document:
        assert document["type"] == "feedapi_dagster.FeedApiComponent", block.where
        load_component(document["attributes"], tmp_path)
    else:
        part = document.get("attributes", document)
        unknown = set(part) - {"lakehouse", "storage", "spark", "feeds", "translation"}
        assert not unknown, f"{block.where}: neither a defs.yaml nor a part of its attributes: {unknown}"
        attributes = copy.deepcopy(BASE_ATTRIBUTES)
        if part.get("storage") and "lakehouse" not in part:
            attributes["lakehouse"] = "s3a://bucket/lake"  # a storage block is for an s3a:// lakehouse
        load_component({**attributes, **part}, tmp_path)


# ------------------------------------------------------------------------------------------ bash
def commands(body: str) -> Iterator[list[str]]:
    """The block's commands as argument lists (comments, `&` and a here-document's text left out)."""
    for line in body.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words.pop()
        if words:
            yield words


def click_accepts(program: str, arguments: list[str]) -> None:
    result = subprocess.run([str(BIN / program), *arguments, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"`{program} {shlex.join(arguments)}`: {result.stderr[-2000:]}"


def feedapi_dagster_accepts(arguments: list[str]) -> None:
    from feedapi_dagster.cli import build_parser

    try:
        build_parser().parse_args(arguments)
    except SystemExit as exc:
        pytest.fail(f"`feedapi-dagster {shlex.join(arguments)}` is refused by its parser (exit {exc.code})")


def check_command(words: list[str], block: Block, demo_url: str) -> None:
    program, arguments = Path(words[0]).name, words[1:]
    if program == "feedapi-dagster":
        feedapi_dagster_accepts(arguments)
    elif program in ("dagster", "dagster-daemon", "dagster-webserver", "dg"):
        click_accepts(program, arguments)
    elif program == "make":
        result = subprocess.run(["make", "-n", *arguments], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{block.where}: `make {shlex.join(arguments)}`: {result.stderr}"
    elif program == "python" and arguments[:2] == ["-m", "tests.chaos"]:
        try:
            chaos_parser().parse_args(arguments[2:])
        except SystemExit as exc:
            pytest.fail(f"{block.where}: `python {shlex.join(arguments)}` is refused by its parser (exit {exc.code})")
    elif program == "curl":
        url = re.sub(r"http://127\.0\.0\.1:\d+/feed", demo_url, arguments[-1])
        url = re.sub(r"stream=\d+", "stream=1500", url)  # the stream as written, shorter
        result = subprocess.run(
            ["curl", "-sS", "--max-time", "20", *arguments[:-1], url], capture_output=True, timeout=30
        )
        assert result.returncode == 0 and b'{"cursor":' in result.stdout, (block.where, result)  # its checkpoints
    elif program == "export":
        subprocess.run(["bash", "-c", shlex.join(words)], check=True, timeout=10)
    else:
        pytest.fail(f"{block.where}: no check for the command `{program}`: add one to {Path(__file__).name}")


def assert_test_exists(reference: str) -> None:
    path, name = reference.split("::")
    tree = ast.parse((REPO / path).read_text())
    assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, f"no test {reference}"


def chaos_parser():
    """`python -m tests.chaos`'s parser: its module runs the chaos at import, so its statements up to
    the parse are run here (the parser is built at the module's top level)."""
    module = ast.parse((REPO / "tests" / "chaos" / "__main__.py").read_text())
    namespace: dict = {}
    for statement in module.body:
        if isinstance(statement, ast.ImportFrom) and statement.level:
            continue  # the harness: not needed to parse
        if isinstance(statement, ast.Assign) and "parse_args" in ast.unparse(statement.value):
            return namespace["parser"]
        exec(compile(ast.Module([statement], []), "tests/chaos/__main__.py", "exec"), namespace)
    raise AssertionError("tests/chaos/__main__.py parses no arguments")


@pytest.mark.parametrize("block", of("bash"))
def test_shell_block_commands_are_accepted(block: Block, demo_feed_server) -> None:
    if "run-by" in block.marks:
        assert_test_exists(block.marks["run-by"])
        from tests.packaging.test_wheel import quickstart_block

        assert block.marks["run-by"].startswith("tests/packaging/test_wheel.py::")
        assert block.body == quickstart_block(), f"{block.where} is not the quick start test_wheel.py runs"
        return
    for words in commands(block.body):
        check_command(words, block, demo_feed_server.url)


# ------------------------------------------------------------------------------------ python, sql
@pytest.fixture(scope="module")
def demo_feed_server():
    from feedapi_dagster.demo.feedapi.demo_feed import DemoFeed
    from feedapi_dagster.demo.feedapi.server import DemoFeedServer

    with DemoFeedServer(DemoFeed(partitions=2, events=300, seed=36)) as server:
        yield server


@pytest.fixture(scope="module")
def nakadi_server():
    from feedapi_dagster.demo.nakadi.event_type import NakadiEventType
    from feedapi_dagster.demo.nakadi.server import NakadiDemoServer

    with NakadiDemoServer(NakadiEventType("shop.order-placed", partitions=2, events=200, seed=36)) as server:
        yield server


def localised(code: str, folder: Path, demo_url: str, nakadi_url: str) -> str:
    """The block as it runs here: its `lakehouse/` in the page's folder, its example feeds served."""
    code = re.sub(r"(?<![\w/.-])lakehouse/", f"{folder}/lakehouse/", code)
    code = code.replace("https://feeds.example.com/orders", demo_url)
    return code.replace("https://nakadi.example.com", nakadi_url)


def load_orders_table(spark, folder: Path, demo_url: str) -> None:
    """`setup=orders_table`: the page's lakehouse/orders loaded from the demo feed (its creation and the
    rows commit, whose rows hold the cursors: versions 0-1)."""
    from feedapi_dagster.lakehouse.feed_table import FeedTable
    from feedapi_dagster.lakehouse.loader import FeedLoader
    from feedapi_dagster.lakehouse.sink import DeltaSink
    from feedapi_dagster.protocol import feed_settings

    sink = DeltaSink(FeedTable(spark, str(folder / "lakehouse" / "orders")))
    FeedLoader(feed_settings(url=demo_url), sink).sync()


def load_table_in(form: str):
    """`setup=variant_table`, `setup=columns_table`: the page's lakehouse/orders loaded from the demo feed
    with `payload_form: <form>` (a page's earlier block may have loaded it in another form)."""

    def load(spark, folder: Path, demo_url: str) -> None:
        from feedapi_dagster.lakehouse.feed_table import FeedTable
        from feedapi_dagster.lakehouse.loader import FeedLoader
        from feedapi_dagster.lakehouse.sink import DeltaSink
        from feedapi_dagster.protocol import feed_settings

        table = folder / "lakehouse" / "orders"
        shutil.rmtree(table, ignore_errors=True)
        FeedLoader(feed_settings(url=demo_url), DeltaSink(FeedTable(spark, str(table), payload_form=form))).sync()

    return load


SETUPS = {
    "orders_table": load_orders_table,
    "variant_table": load_table_in("variant"),
    "columns_table": load_table_in("columns"),
}
PAGES_TO_RUN = sorted({b.page for b in BLOCKS if b.lang in ("python", "sql")})


@pytest.mark.spark
@pytest.mark.parametrize("page", PAGES_TO_RUN, ids=lambda p: str(p.relative_to(REPO)))
def test_python_and_sql_blocks_run(
    page: Path, spark, demo_feed_server, nakadi_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from feedapi_dagster.lakehouse.feed_views import register_feed_views
    from feedapi_dagster.orchestration.sql_command import feed_sql

    monkeypatch.chdir(tmp_path)
    namespace: dict = {"spark": spark, "url": demo_feed_server.url, "partition_id": 0, "my_defs": dg.Definitions()}
    for block in (b for b in blocks_of(page) if b.lang in ("python", "sql")):
        if "setup" in block.marks:
            SETUPS[block.marks["setup"]](spark, tmp_path, demo_feed_server.url)
        code = localised(block.body, tmp_path, demo_feed_server.url, nakadi_server.url)
        before = dict(namespace)
        try:
            if block.lang == "sql":  # as `feedapi-dagster sql` runs it in the project's folder: the block unchanged
                register_feed_views(spark, {"orders": str(tmp_path / "lakehouse" / "orders")})
                for statement in filter(str.strip, re.sub(r"--[^\n]*", "", block.body).split(";")):
                    feed_sql(spark, statement, tmp_path).collect()
                continue
            exec(compile(code, block.where, "exec"), namespace)
            for name, value in namespace.items():
                if before.get(name) is value:
                    continue
                if isinstance(value, StreamingQuery):
                    assert value.awaitTermination(120), f"{block.where}: the query `{name}` did not end in 120 s"
                    assert value.exception() is None, value.exception()
                elif isinstance(value, DataFrame) and not value.isStreaming:
                    assert value.limit(1).collect(), f"{block.where}: `{name}` reads no row"
        except Exception as error:
            raise AssertionError(f"the block at {block.where} fails: {error!r}") from error
        finally:
            for query in spark.streams.active:
                with contextlib.suppress(Exception):
                    query.stop()
    assert os.getcwd() == str(tmp_path)
