"""A dg project's definitions loaded as `dg` loads them, for the commands run in its folder
(`feedapi-dagster discover`, `feedapi-dagster sql`): its `.env` read, its defs folder loaded, and a
project that does not load reported in one line."""

from __future__ import annotations

import os
import re
from pathlib import Path

import dagster as dg
from pydantic import ValidationError

from feedapi_dagster.errors import ProjectDoesNotLoad

_PYDANTIC_DETAILS = re.compile(r"\s*\[type=[^\]]*\]")


def load_project_definitions(root: Path) -> dg.Definitions:
    """The definitions of the dg project at `root` (its `.env` read into this process first, the
    environment winning); `ProjectDoesNotLoad`, one line, where its code or YAML fails."""
    _load_env_file(root)
    try:
        return dg.load_from_defs_folder(path_within_project=root)
    except Exception as error:  # the project's own code and YAML: what `dg check defs` reports, in one line
        raise ProjectDoesNotLoad(f"the dg project at {root} does not load: {_root_cause(error)}") from None


def _root_cause(error: BaseException) -> str:
    """The error a load's chain of exceptions began with, in one line (of a pydantic error, its
    errors: `attributes.feeds.0.page_size_hnt at .../defs.yaml:10 Extra inputs are not permitted`)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, ValidationError):
        # not its count line, its link, nor the value it refused (a misspelt `token:` holds a secret)
        lines = [_PYDANTIC_DETAILS.sub("", line) for line in lines[1:] if not line.startswith("For further")]
    return " ".join(line.replace("`", "") for line in lines) or type(error).__name__


def _load_env_file(root: Path) -> None:
    """The project's `.env` into this process, as `dg` reads it (the environment wins)."""
    # the `.env` reader `dg` uses (Dagster has no public one)
    from dagster._core.secrets.env_file import get_env_var_dict

    for name, value in get_env_var_dict(str(root)).items():
        os.environ.setdefault(name, value)
