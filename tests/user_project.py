"""A user's own `dg` project that gains a feed by one defs.yaml: what the README's "Add it to your
Dagster project" makes, written into a temporary folder.

Beside the feed it has the user's own asset and a resource of its own under the key `spark` (a
dagster-pyspark resource), as a real project would; `feedapi-dagster` must not collide with either.
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import yaml

MODULE = "user_project"


def write_user_project(root: Path, feed_url: str, spark: dict, *, lakehouse: Path, feed: dict | None = None) -> Path:
    """The project at `root` (pyproject.toml with [tool.dg], `user_project/definitions.py`,
    `user_project/defs/feeds/defs.yaml`, `user_project/defs/reports.py`, workspace.yaml)."""
    package = root / MODULE
    (package / "defs" / "feeds").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
        [project]
        name = "user-project"
        version = "0.0.1"

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "{MODULE}"
        """)
    )
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(
        textwrap.dedent("""\
        from pathlib import Path

        import dagster as dg


        @dg.definitions
        def defs():
            return dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent.parent)
        """)
    )
    (package / "defs" / "reports.py").write_text(
        textwrap.dedent("""\
        import dagster as dg
        from dagster_pyspark import LazyPySparkResource


        @dg.asset(group_name="reports")
        def daily_report(spark: LazyPySparkResource) -> None:
            pass


        @dg.definitions
        def reports():
            return dg.Definitions(assets=[daily_report],
                                  resources={"spark": LazyPySparkResource(spark_config={"spark.app.name": "user"})})
        """)
    )
    attributes = {
        "lakehouse": str(lakehouse),
        "spark": spark,
        # a None in `feed` leaves the key out (a protocol without FeedAPI's dialect, a feed without a token)
        "feeds": [
            {
                key: value
                for key, value in {
                    "name": "orders",
                    "url": feed_url,
                    "dialect": "published",
                    "page_size_hint": 50,
                    "token": "{{ env.ORDERS_FEED_TOKEN }}",
                    **(feed or {}),
                }.items()
                if value is not None
            }
        ],
    }
    (package / "defs" / "feeds" / "defs.yaml").write_text(
        yaml.safe_dump({"type": "feedapi_dagster.FeedApiComponent", "attributes": attributes}, sort_keys=False)
    )
    (root / "workspace.yaml").write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_module": {
                            "module_name": f"{MODULE}.definitions",
                            "working_directory": str(root),
                            "location_name": "user",
                        }
                    }
                ]
            }
        )
    )
    return root


@contextlib.contextmanager
def importable(root: Path) -> Iterator[Path]:
    """The project's module importable from this process (as its code server would import it)."""
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == MODULE or m.startswith(f"{MODULE}.")]:
            del sys.modules[name]
