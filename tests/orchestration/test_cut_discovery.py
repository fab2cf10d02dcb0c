"""A feed behind a proxy that cuts its discovery answers mid-body (`tests/cutting_proxy.py`), as its
sensor, schedule, asset and stream job meet it in a real Dagster instance: cut on the first tries,
discovery is read on a later one; cut every time, each says so in one line naming the feed, with no
chain of `requests`/`urllib3` exceptions beneath; let through again, the next tick recovers."""

import dagster as dg
import pytest

from feedapi_dagster.orchestration import SparkResource, build_feedapi_definitions
from feedapi_dagster.spark.settings import SparkSettings
from tests.cutting_proxy import Cut, CuttingProxy

from .conftest import Harness


def discovery(path: str, status: int) -> bool:
    return path == "/feed"  # the published dialect's discovery; its pages are /feed/events


def behind(harness: Harness, proxy: CuttingProxy) -> Harness:
    """The harness's feed read through `proxy`."""
    feed = harness.feed_config
    feed = feed.model_copy(update={"settings": feed.settings.model_copy(update={"url": proxy.url})})
    project = harness.project.model_copy(update={"feeds": [feed]})
    defs = build_feedapi_definitions(project, spark=SparkResource(settings=SparkSettings(mode="local")))
    return Harness(harness.feed, harness.server, project, defs, harness.instance)


def one_clear_line(description: str | None, harness: Harness, proxy: CuttingProxy, what: str) -> None:
    """`description` is one line saying that `what` failed, for feed orders at the proxy's URL, after
    every attempt's discovery answer was cut."""
    assert description is not None
    attempts = harness.feed_config.settings.retry.max_attempts
    assert description.startswith(
        f"feed orders: {what} failed: feed {proxy.url}: giving up after {attempts} attempts: "
        "discovery: the answer (HTTP 200) was cut short: "
    ), description
    assert "\n" not in description


def test_a_cut_discovery_is_retried_and_one_clear_line_where_it_never_comes_whole(harness):
    attempts = harness.feed_config.settings.retry.max_attempts
    # announced by its Content-Length, half of the body, then the connection closes
    with CuttingProxy(harness.server.url, Cut(discovery, times=attempts - 1, framing="length")) as proxy:
        cut = behind(harness, proxy)
        # cut on all tries but the last: the tick registers the partitions and asks for their load
        result = cut.tick_sensor()
        assert proxy.cuts[0].done == attempts - 1
        assert result.run_requests and result.dynamic_partitions_requests

        proxy.cuts = [Cut(discovery, framing="chunked")]  # from now on, every discovery answer is cut mid-chunk
        # the sensor's evaluation fails with one line, not the raw IncompleteRead it raised
        with pytest.raises(dg.Failure) as raised:
            cut.tick_sensor()
        one_clear_line(raised.value.description, cut, proxy, "discovery")
        assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no chain beneath

        # the schedule asks nothing of the feed: its run does, and fails in one line
        (request,) = cut.tick_schedule().run_requests
        run = cut.launch(request, raise_on_error=False)
        assert not run.success
        (failed,) = run.get_step_failure_events()
        data = failed.step_failure_data
        assert data.user_failure_data is not None and data.error is not None
        assert data.error.cls_name == "Failure" and data.error.cause is None
        one_clear_line(data.user_failure_data.description, cut, proxy, "the load")

        # the stream job: neither its catch-up (the default) nor its query is even started
        job = cut.defs.resolve_job_def("feedapi_orders_stream")
        for config, what in (({}, "the stream's catch-up"), ({"catch_up": False}, "the stream")):
            streamed = job.execute_in_process(
                instance=cut.instance,
                raise_on_error=False,
                run_config={"ops": {"feedapi_orders_stream_op": {"config": config}}},
            )
            assert not streamed.success
            (failed,) = streamed.get_step_failure_events()
            assert failed.step_failure_data.user_failure_data is not None
            one_clear_line(failed.step_failure_data.user_failure_data.description, cut, proxy, what)

        # the proxy mended: the next tick recovers (the next run is a load as any: tests/orchestration/test_flow.py)
        proxy.cuts = []
        assert cut.tick_sensor().skip_reason == dg.SkipReason("no change in discovery")
