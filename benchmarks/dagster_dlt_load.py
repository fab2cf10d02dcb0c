"""The feed through dagster-dlt, as a Dagster user would load it with dlt: the resources of
`dlt_load.py` as one `@dlt_assets` asset run by `DagsterDltResource`, its job executed by `dagster job
execute`, its step in that process (`bench_sync.py` starts and times it, from process start to exit).

    DAGSTER_HOME=... BENCH_FEED_URL=... BENCH_PAGE_SIZE=5000 BENCH_WORK=... \\
        .venv/bin/dagster job execute -f benchmarks/dagster_dlt_load.py -j dagster_dlt_bench

Needs the `bench` extra (dlt, dagster-dlt). The table is `$BENCH_WORK/dlt_lake/feed/events`.
"""

import os
import sys
from pathlib import Path

import dagster as dg
import dlt
from dagster_dlt import DagsterDltResource, dlt_assets

sys.path.insert(0, str(Path(__file__).parent))  # `dagster job execute -f` loads this file alone
from dlt_load import feed_resources  # noqa: E402 - after the path is set

WORK = Path(os.environ["BENCH_WORK"])
os.environ["DLT_DATA_DIR"] = str(WORK / "dlt_data")
os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
os.environ.setdefault("EXTRACT__WORKERS", "8")


@dlt.source(name="bench_feed")
def feed_source():
    return feed_resources(os.environ["BENCH_FEED_URL"], int(os.environ["BENCH_PAGE_SIZE"]))


@dlt_assets(
    dlt_source=feed_source(),
    dlt_pipeline=dlt.pipeline(
        pipeline_name="bench_feed",
        pipelines_dir=str(WORK / "dlt_pipelines"),
        destination=dlt.destinations.filesystem(bucket_url=(WORK / "dlt_lake").as_uri()),
        dataset_name="feed",
        progress=None,
    ),
    name="bench_feed",
)
def bench_feed_assets(context: dg.AssetExecutionContext, dlt: DagsterDltResource):
    yield from dlt.run(context=context)


defs = dg.Definitions(
    assets=[bench_feed_assets],
    resources={"dlt": DagsterDltResource()},
    # one process, as this project's load job (the default executor would start a second one for the step)
    jobs=[dg.define_asset_job("dagster_dlt_bench", selection=[bench_feed_assets], executor_def=dg.in_process_executor)],
)
