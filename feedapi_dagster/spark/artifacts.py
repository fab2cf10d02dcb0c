"""Python sources a Spark Connect session's workers are sent (`SparkSession.addArtifacts(..., pyfile=True)`,
`read.registration.register_feed_source`): this package, for a cluster whose Python lacks it (`package_zip`),
and the package of a user's protocol (`protocol_zip`), for every Connect server: an embedded server's
Python workers import what the process that started it could import, not what a later run's
`definitions.py` put on that run's path.

A zip holds the sources of a top-level package (all of it: a worker puts the zip first on its path,
where a part of a package would hide the rest of an installed one) and is named by their content. A
server-side session refuses another file under a name it has (ARTIFACT_ALREADY_EXISTS) and accepts
the same one again, and every client of the embedded server joins one session: a run after an edit of
the module sends a zip of another name, a run without one sends the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

from feedapi_dagster.errors import SparkError

# a zip's bytes depend on the sources alone (a timestamp of its own would make the same name another file)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def package_zip() -> Path:
    """This package as a zip of its Python sources."""
    return _sources_zip(sys.modules[__name__.partition(".")[0]])


def protocol_zip(module: str) -> Path:
    """The top-level package of `module` (a user's protocol, imported in this process) as a zip of its
    Python sources; the module alone where it is a top-level module."""
    return _sources_zip(sys.modules[module.partition(".")[0]])


def _sources(top: ModuleType) -> dict[str, bytes]:
    """The Python sources of a top-level module or package (a namespace package's folders too), by
    their path in the zip."""
    folders = getattr(top, "__path__", None)
    if folders is None:
        return {Path(top.__file__).name: Path(top.__file__).read_bytes()} if top.__file__ else {}
    sources: dict[str, bytes] = {}
    for folder in map(Path, folders):
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" not in path.parts:
                sources.setdefault(f"{top.__name__}/{path.relative_to(folder).as_posix()}", path.read_bytes())
    return sources


def _sources_zip(top: ModuleType) -> Path:
    sources = _sources(top)
    digest = hashlib.sha256()
    for name, content in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    target = _own_folder() / f"{top.__name__}-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, content in sorted(sources.items()):
                entry = zipfile.ZipInfo(name, _ZIP_TIME)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = 0o644 << 16
                archive.writestr(entry, content)
        partial.replace(target)
    return target


def _own_folder() -> Path:
    """This user's folder of zips in the temp folder: code the Spark workers run, so a folder someone
    else made or could write to is refused."""
    folder = Path(tempfile.gettempdir()) / f"feedapi-dagster-artifacts-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SparkError(f"{folder} must belong to this user with mode 0700; not sending Spark code from it")
    return folder
