"""The zip of a user's protocol package that a Spark Connect session is sent (`artifacts.protocol_zip`):
its name and bytes follow the sources alone, since a server-side session refuses another file under
a name it has, and it is never taken from a folder someone else could write to."""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
from pathlib import Path

import pytest

from feedapi_dagster.errors import SparkError
from feedapi_dagster.spark.artifacts import protocol_zip


@pytest.fixture
def package(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "project" / "zipped_protocols"
    (root / "helpers").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "helpers" / "__init__.py").write_text("")
    (root / "helpers" / "paging.py").write_text("STEP = 10\n")
    (root / "jsonlines.py").write_text("from .helpers.paging import STEP\n")
    (root / "notes.txt").write_text("not Python")
    monkeypatch.syspath_prepend(str(root.parent))
    importlib.import_module("zipped_protocols.jsonlines")
    yield root
    for name in [name for name in sys.modules if name.startswith("zipped_protocols")]:
        del sys.modules[name]


def test_the_zip_holds_the_whole_package_and_follows_its_sources_alone(package: Path) -> None:
    first = protocol_zip("zipped_protocols.jsonlines")
    assert zipfile.ZipFile(first).namelist() == [
        "zipped_protocols/__init__.py",
        "zipped_protocols/helpers/__init__.py",
        "zipped_protocols/helpers/paging.py",
        "zipped_protocols/jsonlines.py",
    ]
    content = first.read_bytes()
    first.unlink()  # the temp folder was cleaned; the files were touched
    for path in package.rglob("*.py"):
        os.utime(path, (1, 1))
    again = protocol_zip("zipped_protocols.jsonlines")
    assert (again, again.read_bytes()) == (first, content)

    (package / "jsonlines.py").write_text("from .helpers.paging import STEP  # edited\n")
    edited = protocol_zip("zipped_protocols.jsonlines")
    assert edited != first and edited.name.startswith("zipped_protocols-")


def test_a_folder_others_can_write_to_is_refused(package: Path) -> None:
    folder = protocol_zip("zipped_protocols.jsonlines").parent
    folder.chmod(0o777)
    with pytest.raises(SparkError, match="must belong to this user with mode 0700; not sending Spark code from it"):
        protocol_zip("zipped_protocols.jsonlines")
