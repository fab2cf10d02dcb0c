#!/usr/bin/env python
"""The feed through a dlt pipeline into a Delta table, in a process of its own (`bench_sync.py` starts it).

    .venv/bin/python benchmarks/dlt_load.py URL PAGE_SIZE WORK_DIR EXPECTED_EVENTS [--workers 8]
        [--bucket-url s3://bench/dlt --endpoint http://127.0.0.1:9000]   # the Delta table on S3
        [--nakadi-event-type bench.orders]         # URL is a Nakadi base URL: read that event type

What a dlt user would write (needs the `bench` extra, `dlt[deltalake]`): one `parallelized=True`
resource per feed partition (per group of partitions past 16), paging through it from `_first` and yielding one `pyarrow.Table` per page
(partition_id, position, cursor, payload = the raw JSON text of `data`, cut out by msgspec);
`write_disposition="append"` into the `filesystem` destination with `table_format="delta"`, on local
disk or on S3 (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
A Nakadi event type is read the same way, a partition's low-level event stream from BEGIN to the
newest offset its listing gave, one `pyarrow.Table` per batch. `pipeline.run` is timed; the table must hold EXPECTED_EVENTS rows. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import msgspec
import requests


class _Line(msgspec.Struct):
    """A published-dialect line: an event (`data`, kept as raw JSON text) or a checkpoint (`cursor`)."""

    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    cursor: str | None = None


def partition_pages(url: str, token: str, partition_id: int, page_size: int):
    """Pages of one partition from `_first` until a page no longer moves the cursor; one Arrow table each."""
    import pyarrow as pa

    decoder = msgspec.json.Decoder(_Line)
    cursor, position = "_first", 0
    with requests.Session() as session:
        while True:
            response = session.get(
                f"{url}/events",
                params={"token": token, "partition": partition_id, "cursor": cursor, "pagesizehint": page_size},
                timeout=60,
            )
            response.raise_for_status()
            payloads: list[str] = []
            cursors: list[str] = []
            pending: list[str] = []
            following = cursor
            for line in decoder.decode_lines(response.content):
                if line.data is not msgspec.UNSET:
                    pending.append(bytes(line.data).decode())
                elif line.cursor is not None:  # the events since the last checkpoint are covered by it
                    following = line.cursor
                    cursors.extend([following] * len(pending))
                    payloads.extend(pending)
                    pending = []
            if payloads:
                count = len(payloads)
                yield pa.table(
                    {
                        "partition_id": pa.array([partition_id] * count, pa.int32()),
                        "position": pa.array(range(position, position + count), pa.int64()),
                        "cursor": pa.array(cursors, pa.string()),
                        "payload": pa.array(payloads, pa.string()),
                    }
                )
                position += count
            if following == cursor:
                return
            cursor = following


class _Batch(msgspec.Struct):
    """A Nakadi EventStreamBatch: the events kept as raw JSON text, the cursor of the last one."""

    cursor: dict
    events: list[msgspec.Raw] = []


def nakadi_pages(url: str, partition: dict, page_size: int):
    """A Nakadi partition's batches from BEGIN up to its listed newest offset; one Arrow table each."""
    import pyarrow as pa

    decoder = msgspec.json.Decoder(_Batch)
    partition_id, newest, position = int(partition["partition"]), partition["newest_available_offset"], 0
    if newest == "BEGIN":
        return
    cursors = json.dumps([{"partition": partition["partition"], "offset": "BEGIN"}])
    with requests.get(
        f"{url}/events",
        headers={"X-Nakadi-Cursors": cursors},
        stream=True,
        timeout=60,
        params={"batch_limit": page_size, "batch_flush_timeout": 1, "stream_timeout": 60},
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines(256 * 1024):
            batch = decoder.decode(line)
            if batch.events:
                count = len(batch.events)
                yield pa.table(
                    {
                        "partition_id": pa.array([partition_id] * count, pa.int32()),
                        "position": pa.array(range(position, position + count), pa.int64()),
                        "cursor": pa.array([batch.cursor["offset"]] * count, pa.string()),
                        "payload": pa.array([bytes(event).decode() for event in batch.events], pa.string()),
                    }
                )
                position += count
            if batch.cursor["offset"] == newest or not batch.events:
                return


def group_pages(url: str, token: str | None, partitions: list, page_size: int):
    """The pages of several partitions, one after the other: one resource for many small partitions
    (dlt fails with a RecursionError in extract on 2,000 resources). `token` None: Nakadi's."""
    for partition in partitions:
        if token is None:
            yield from nakadi_pages(url, partition, page_size)
        else:
            yield from partition_pages(url, token, partition, page_size)


# resources of a pipeline at most: one per partition up to this, then partitions share them
MAX_RESOURCES = 16


def feed_resources(url: str, page_size: int, nakadi_event_type: str | None = None) -> list:
    """The dlt resources of the feed at `url` (or of the Nakadi event type there): one `parallelized`
    resource per partition, per group of partitions past `MAX_RESOURCES`, all into the table `events`."""
    import dlt

    if nakadi_event_type:
        url = f"{url}/event-types/{nakadi_event_type}"
        token, partitions = None, requests.get(f"{url}/partitions", timeout=30).json()
    else:
        document = requests.get(url, timeout=30).json()
        token, partitions = document["token"], [int(p["id"]) for p in document["partitions"]]
    groups = [partitions[i::MAX_RESOURCES] for i in range(min(MAX_RESOURCES, len(partitions)))]
    return [
        dlt.resource(
            group_pages,
            name=f"feed_partitions_{index}",
            table_name="events",
            write_disposition="append",
            table_format="delta",
            parallelized=True,
        )(url, token, group, page_size)
        for index, group in enumerate(groups)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("page_size", type=int)
    parser.add_argument("work", type=Path)
    parser.add_argument("expected", type=int)
    parser.add_argument("--workers", type=int, default=8, help="dlt extract workers (threads)")
    parser.add_argument("--bucket-url", default=None, help="an s3:// folder for the table (default: WORK/dlt_lake)")
    parser.add_argument("--endpoint", default=None, help="the S3-compatible server of --bucket-url")
    parser.add_argument("--nakadi-event-type", default=None, help="URL is Nakadi's: read this event type")
    args = parser.parse_args()
    os.environ["DLT_DATA_DIR"] = str(args.work / "dlt_data")
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("EXTRACT__WORKERS", str(args.workers))
    import dlt
    from dlt.common.libs.deltalake import get_delta_tables

    resources = feed_resources(args.url, args.page_size, args.nakadi_event_type)
    if args.bucket_url:
        from dlt.common.configuration.specs import AwsCredentials

        credentials = AwsCredentials(
            aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
            endpoint_url=args.endpoint,
        )
        destination = dlt.destinations.filesystem(bucket_url=args.bucket_url, credentials=credentials)
    else:
        destination = dlt.destinations.filesystem(bucket_url=(args.work / "dlt_lake").as_uri())
    pipeline = dlt.pipeline(
        pipeline_name="bench_feed",
        pipelines_dir=str(args.work / "dlt_pipelines"),
        destination=destination,
        dataset_name="feed",
        progress=None,
    )
    started = time.perf_counter()
    pipeline.run(resources)
    seconds = time.perf_counter() - started
    rows = get_delta_tables(pipeline, "events")["events"].to_pyarrow_dataset().count_rows()
    steps = {
        step.step: (step.finished_at - step.started_at).total_seconds()
        for step in (pipeline.last_trace.steps if pipeline.last_trace else [])
        if step.started_at and step.finished_at
    }
    print(json.dumps({"seconds": seconds, "rows": rows, "version": dlt.__version__, "steps": steps}))
    return 0 if rows == args.expected else 1


if __name__ == "__main__":
    sys.exit(main())
