"""The stream job of a feed, `feedapi_<feed>_stream`: one op running the feed's Structured Streaming
query for the run (`streams.py` says what it does), in the feed's pool like its loads."""

import dagster as dg

from .loads import FEED_TAG, FeedBinding
from .resources import FeedApiResource
from .streams import StreamConfig


def build_stream_job(binding: FeedBinding) -> dg.JobDefinition:
    name = binding.name

    @dg.op(name=f"feedapi_{name}_stream_op", pool=binding.pool, tags={"kind": "spark"}, out={})
    def stream_op(context: dg.OpExecutionContext, config: StreamConfig, feedapi: FeedApiResource):
        yield from feedapi.stream(context, binding, config)

    @dg.job(
        name=stream_job_name(binding),
        tags={FEED_TAG: name},
        executor_def=dg.in_process_executor,
        description=f"Runs feed `{name}` as a Spark Structured Streaming query into its Delta table "
        "(availableNow per run by default, or processingTime for a long-running run).",
    )
    def stream_job():
        stream_op()

    return stream_job


def stream_job_name(binding: FeedBinding) -> str:
    return f"feedapi_{binding.name}_stream"
