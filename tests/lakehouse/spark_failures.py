"""Two Spark failures made for real, for `test_spark_errors.py`: a kept read whose blocks are gone (as
with a dead executor) and a Delta commit that loses to another writer's. Run in the test process for
the classic session, and as a script for a Spark Connect session (which cannot share a process with
a classic one):

    FEEDAPI_TEST_CONNECT_URL=sc://... python -m tests.lakehouse.spark_failures WORK_DIR LOCAL_DIRS

prints one JSON line: each failure's type, error condition and whether `spark.failures` classifies it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from feedapi_dagster.spark.failures import condition, is_commit_conflict, is_kept_read_lost


def lost_kept_read(spark: Any, local_dirs: Path) -> BaseException:
    """The error of a job reading a `localCheckpoint` whose block files were removed."""
    from pyspark import StorageLevel

    before = set(local_dirs.rglob("rdd_*"))
    kept = spark.range(0, 1000, numPartitions=2).localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
    blocks = set(local_dirs.rglob("rdd_*")) - before
    assert blocks, f"no block files of the kept read under {local_dirs}"
    for block in blocks:
        block.unlink()
    try:
        kept.count()
    except Exception as error:  # noqa: BLE001 - what Spark raises is the point
        return error
    raise AssertionError("the kept read's blocks were removed, yet it was read")


def lost_commit_race(spark: Any, work_dir: Path) -> BaseException:
    """The error of a replaceWhere overwrite of a partition that another writer appended to while the
    overwrite ran (a UDF holds it until the append landed)."""
    from pyspark.sql import functions as F

    path = str(work_dir / "raced")
    started, go = work_dir / "overwrite-started", work_dir / "append-landed"
    spark.sql(f"CREATE TABLE delta.`{path}` (partition_id INT, v BIGINT) USING delta")

    def held(value):  # nested: pickled by value, for the server's Python workers too
        import pathlib
        import time

        pathlib.Path(started).touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    hold = F.udf(held, "bigint")
    errors: list[BaseException] = []

    def overwrite() -> None:
        try:
            (
                spark.range(1)
                .select(F.lit(1).alias("partition_id"), hold(F.col("id")).alias("v"))
                .write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", "partition_id = 1")
                .save(path)
            )
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    writer = threading.Thread(target=overwrite)
    writer.start()
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    spark.createDataFrame([(1, 5)], "partition_id INT, v BIGINT").write.format("delta").mode("append").save(path)
    go.touch()
    writer.join(120)
    assert errors, "the overwrite committed over the append it did not read"
    return errors[0]


def classified(spark: Any, work_dir: Path, local_dirs: Path) -> dict[str, dict[str, Any]]:
    kept, raced = lost_kept_read(spark, local_dirs), lost_commit_race(spark, work_dir)
    return {
        name: {
            "type": type(error).__name__,
            "condition": condition(error),
            "kept_read_lost": is_kept_read_lost(error),
            "commit_conflict": is_commit_conflict(error),
        }
        for name, error in (("kept", kept), ("raced", raced))
    }


def main() -> None:
    from feedapi_dagster.spark.sessions import connect_session

    spark = connect_session(os.environ["FEEDAPI_TEST_CONNECT_URL"])
    try:
        print(json.dumps(classified(spark, Path(sys.argv[1]), Path(sys.argv[2]))), flush=True)
    finally:
        # the channel closed, the session kept: it is the tests' server's one shared session
        # (`client_url`), which `stop()` would release for every other client of the server (their
        # next call: SESSION_CLOSED)
        spark.client.close()


if __name__ == "__main__":
    main()
