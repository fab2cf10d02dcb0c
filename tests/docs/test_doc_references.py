"""The files, modules and names the documentation points at exist (issue 36: docs that cannot rot).

The pages: README.md, docs/**/*.md, benchmarks/README.md. Cheap: text and `ast`, no import, no Spark.

How a reference resolves:
- A path `something.py` (anywhere in a page, code blocks included) that has a folder in it
  (`lakehouse/commit.py`, `tests/docs/test_doc_blocks.py`) is a file of this repository relative to
  one of `feedapi_dagster/`, `tests/`, `benchmarks/`, `dagster_project/` or the repository's root,
  tried in that order. A bare file name (`commit.py`) is written where the text already says which
  folder it is in (a layer's line of the layout page, "the lakehouse's `loader.py`"): it must be the
  name of some file of those folders. A file the repository does not hold (a user's project, a file
  a benchmark writes, a file since removed) is listed in `NOT_IN_REPOSITORY` with why; an entry no
  page names any more fails too.
- A dotted `feedapi_dagster.x.y` is a module of the package (`x/y.py`, or `x/y/__init__.py`), or a
  module followed by a name that module defines or imports (`feedapi_dagster.spark.sessions.
  local_spark_session`, `feedapi_dagster.FeedApiComponent`).
- The internals layout page (docs/internals/layout.md) has one line per file of the package: a list
  item that starts with the file's path relative to `feedapi_dagster/` in backticks. Every file of
  the package has its line, every line's file exists, and every other backticked `Name` or
  `Class.attribute` on that line (an identifier, nothing else: commands, options and quoted strings
  are left alone) is defined at the top level of that file (a class, a function, an assignment; in an
  `__init__.py` an import or an `__all__` entry too), `attribute` in that class's body. A name of
  another module is written with that module, as the package's docstrings do (`commit.ReadCommit`,
  `interface.FeedProtocol`): `module.Name`, where `module.py` is beside the file or one folder up,
  and `Name` is defined there.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "feedapi_dagster"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "benchmarks" / "README.md"]
LAYOUT_PAGE = REPO / "docs" / "internals" / "layout.md"
ROOTS = [PACKAGE, REPO / "tests", REPO / "benchmarks", REPO / "dagster_project", REPO]

NOT_IN_REPOSITORY = {
    "src/my_feeds/definitions.py": "the user's project the README and your-project.md create",
    "my_protocols/auditlog.py": "the user's protocol module adding-a-protocol.md writes",
    "location/definitions.py": "the code location a benchmark writes into its temporary folder",
    "bench_sink.py": "a benchmark removed at 07ec8f1, named in benchmarks/README.md's history",
    "bench_dagster_vs_dlt.py": "a benchmark removed at 07ec8f1, named in benchmarks/README.md's history",
    "jfr_summary.py": "a benchmark removed at 07ec8f1, named in benchmarks/README.md's history",
    "bench_run_start.py": "a benchmark removed at 07ec8f1, named in benchmarks/README.md's history",
}

PY_PATH = re.compile(r"(?<![\w.-])[A-Za-z_][\w./-]*\.py\b")
DOTTED = re.compile(r"\bfeedapi_dagster(?:\.[A-Za-z_]\w*)+")
BACKTICKED = re.compile(r"`([^`\n]+)`")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")
LAYOUT_LINE = re.compile(r"^\s*[-*] `(?P<path>[\w/]+\.py)`(?P<rest>.*)$")


def page_name(page: Path) -> str:
    return str(page.relative_to(REPO))


def references(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(page:line, reference) for every match of `pattern` in the pages."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            found += [(f"{page_name(page)}:{number}", match) for match in pattern.findall(line)]
    return found


@cache
def repository_file_names() -> frozenset[str]:
    return frozenset(path.name for root in ROOTS[:-1] for path in root.rglob("*.py") if ".venv" not in path.parts)


def resolves(path: str) -> bool:
    if "/" not in path:
        return path in repository_file_names()
    return any((root / path).is_file() for root in ROOTS)


@cache
def defined_names(path: Path) -> dict[str, frozenset[str]]:
    """The names `path` defines at its top level, each with the names its class body defines."""
    tree = ast.parse(path.read_text())
    names: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = frozenset(_body_names(node.body))
        else:
            names.update(dict.fromkeys(_body_names([node]), frozenset()))
    if path.name == "__init__.py":
        for inner in ast.walk(tree):
            if isinstance(inner, ast.ImportFrom):
                names.update(dict.fromkeys((alias.asname or alias.name for alias in inner.names), frozenset()))
            elif isinstance(inner, ast.Constant) and isinstance(inner.value, str) and inner.value.isidentifier():
                names.setdefault(inner.value, frozenset())  # `__all__`'s and the lazy exports' strings
    return names


def _body_names(body: list[ast.stmt]) -> list[str]:
    found: list[str] = []
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node.name)
        elif isinstance(node, ast.Assign):
            found += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append(node.target.id)
    return found


def is_defined(name: str, path: Path) -> bool:
    top, _, attribute = name.partition(".")
    names = defined_names(path)
    return top in names and (not attribute or attribute in names[top])


def is_defined_on_layout_line(name: str, path: Path) -> bool:
    """`name` defined in `path`, or `module.Name` defined in a module beside it or one folder up."""
    if is_defined(name, path):
        return True
    module, _, attribute = name.partition(".")
    neighbours = [folder / f"{module}.py" for folder in (path.parent, path.parent.parent)]
    return bool(attribute) and any(n.is_file() and is_defined(attribute, n) for n in neighbours)


def module_file(parts: list[str]) -> Path | None:
    folder = REPO.joinpath(*parts)
    for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_every_py_path_in_the_docs_is_a_file_of_the_repository() -> None:
    found = references(PY_PATH)
    stale = [f"{where}: {path}" for where, path in found if path not in NOT_IN_REPOSITORY and not resolves(path)]
    assert not stale, "paths the docs name that are no file of the repository:\n" + "\n".join(stale)
    named = {path for _, path in found}
    unused = sorted(set(NOT_IN_REPOSITORY) - named)
    assert not unused, f"NOT_IN_REPOSITORY entries no page names any more: {unused}"
    held = sorted(path for path in NOT_IN_REPOSITORY if resolves(path))
    assert not held, f"NOT_IN_REPOSITORY entries the repository does hold: {held}"


def test_every_feedapi_dagster_module_in_the_docs_exists() -> None:
    stale = []
    for where, dotted in references(DOTTED):
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            module = module_file(parts[:end])
            if module is not None:
                rest = ".".join(parts[end:])
                if rest and not is_defined(rest, module):
                    stale.append(f"{where}: {dotted} ({rest} is not defined in {module.relative_to(REPO)})")
                break
    assert not stale, "modules or names the docs name that the package lacks:\n" + "\n".join(stale)


def layout_lines() -> dict[str, str]:
    lines: dict[str, str] = {}
    for line in LAYOUT_PAGE.read_text().splitlines():
        match = LAYOUT_LINE.match(line)
        if match:
            assert match["path"] not in lines, f"{match['path']} has two lines in the layout page"
            lines[match["path"]] = match["rest"]
    return lines


def test_the_layout_page_has_a_line_for_every_file_of_the_package() -> None:
    files = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    listed = set(layout_lines())
    assert not files - listed, f"package files without their line in the layout page: {sorted(files - listed)}"
    assert not listed - files, f"layout page lines for files the package lacks: {sorted(listed - files)}"


@pytest.mark.parametrize("path", sorted(layout_lines()))
def test_the_names_on_a_layout_line_are_defined_in_its_file(path: str) -> None:
    source = PACKAGE / path
    names = [name for name in BACKTICKED.findall(layout_lines()[path]) if IDENTIFIER.fullmatch(name)]
    missing = [name for name in names if not is_defined_on_layout_line(name, source)]
    assert not missing, f"the layout page's line of {path} names what it does not define: {missing}"
