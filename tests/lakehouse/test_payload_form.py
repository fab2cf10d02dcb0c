"""The payload's form (`payload_form`): a variant table's `data` column is each payload parsed, written
in the rows' own commit; a json table switched to variant gets the column in place (its older rows
NULL), and a variant table is not loaded as json. With the log read by delta-rs and by Spark. On the S3
server: every row's `data` is its payload, and each load (streamed, and a rebuild's kept read) reports as
many payloads Spark could not parse as it committed."""

import pytest

from feedapi_dagster.demo import DemoFeed, DemoFeedServer
from feedapi_dagster.errors import PayloadFormMismatch
from feedapi_dagster.lakehouse.payload_form import FormCounts

from .conftest import (
    LOG_READERS,
    ODD_PAYLOADS,
    ON_S3,
    UNPARSEABLE,
    add_odd_events,
    assert_data_is_the_payload,
    table_rows,
    unparsed_rows,
)
from .test_crash import assert_every_event_once


def operations(spark, path) -> list[str]:
    return [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()]


@LOG_READERS
def test_a_json_table_switched_to_variant_gets_the_column_in_place_and_back_to_json_is_refused(
    spark, make_loader, table_path
):
    feed = DemoFeed(partitions=2, events=120, seed=37)
    with DemoFeedServer(feed, dialect="published") as server:
        make_loader(server).sync()  # the default form: today's table, no `data`
        assert spark.read.format("delta").load(table_path).columns[-3:] == ["event_id", "loaded_at", "run_id"]
        loaded = {p: len(table_rows(spark, table_path, p)) for p in (0, 1)}
        older = " OR ".join(f"(partition_id = {p} AND position < {n})" for p, n in loaded.items())

        feed.append(40)
        unparseable = add_odd_events(feed, partition=0)
        make_loader(server, payload_form="variant").sync()
        # the column, then the rows (whose state ends each partition at its newest row: no state commit)
        assert operations(spark, table_path)[-2:] == ["ADD COLUMNS", "WRITE"]
        frame = spark.read.format("delta").load(table_path)
        assert frame.schema["data"].dataType.simpleString() == "variant"
        assert frame.where(older).where("data IS NOT NULL").count() == 0  # the rows loaded before: NULL
        newer = assert_data_is_the_payload(spark, table_path, unparseable, where=f"NOT ({older})")
        assert newer == 40 + len(ODD_PAYLOADS) + len(UNPARSEABLE)

        # a loader given no form (the stream's commits, the state command) writes the table's
        feed.append(20)
        make_loader(server).sync()
        assert assert_data_is_the_payload(spark, table_path, unparseable, where=f"NOT ({older})") == newer + 20

        # a rebuild writes a partition's rows again, with `data`: its older rows too
        make_loader(server).rebuild([1])
        still_null = f"partition_id = 0 AND position < {loaded[0]}"
        assert spark.read.format("delta").load(table_path).where("data IS NULL").count() == loaded[0] + 2
        assert assert_data_is_the_payload(spark, table_path, unparseable, where=f"NOT ({still_null})") == (
            newer + 20 + loaded[1]
        )

        version = len(operations(spark, table_path))
        with pytest.raises(
            PayloadFormMismatch,
            match=r"has the payload's variant column `data` and the feed's "
            r"payload_form is json.*Set `payload_form: variant`",
        ):
            make_loader(server, payload_form="json")
        assert len(operations(spark, table_path)) == version  # nothing committed
    assert_every_event_once(spark, table_path, feed, exactly_once=True)


def unparsed_reported(reports) -> dict[int, int]:
    return {pid: report.unparsed_payloads for pid, report in reports.items()}


@ON_S3
def test_a_variant_feed_on_s3_holds_every_payload_parsed_and_its_loads_count_the_unparseable(
    spark, make_loader, table_path, lakehouse
):
    feed = DemoFeed(partitions=2, events=100, seed=38)
    unparseable = add_odd_events(feed, partition=1)
    with DemoFeedServer(feed, dialect="published") as server:
        loaded = make_loader(server, payload_form="variant").sync()  # a streamed read: rows, then state
        assert table_path.startswith("s3a://")
        assert assert_data_is_the_payload(spark, table_path, unparseable) == 100 + len(ODD_PAYLOADS) + len(UNPARSEABLE)
        assert unparsed_reported(loaded) == {0: 0, 1: 2}
        assert unparsed_rows(spark, table_path) == {1: len(UNPARSEABLE)}

        # a rebuild (a kept read, its rows replaced in one commit) counts what it wrote again
        assert unparsed_reported(make_loader(server).rebuild([1])) == {1: 2}
        assert assert_data_is_the_payload(spark, table_path, unparseable) == 100 + len(ODD_PAYLOADS) + len(UNPARSEABLE)
        assert unparsed_rows(spark, table_path) == {1: 2}
    assert_every_event_once(spark, table_path, feed, exactly_once=True, log=lakehouse.log(table_path))


def test_the_write_jobs_count_of_unparsed_payloads_is_exact_for_every_one_of_many_partitions(spark):
    # 60 feed partitions with uneven counts, their rows spread over 16 Spark tasks whose counts Spark
    # merges; rows without a payload are not counted (a NULL payload is no payload Spark refused)
    frame = spark.range(120_000).selectExpr(
        "CAST(id % 60 AS INT) AS partition_id",
        "CASE WHEN id % 7 = 0 OR (id % 60 < 6 AND id % 2 = 0) THEN NULL ELSE parse_json('1') END AS data",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE 'x' END AS payload",
    )
    counted = FormCounts(partitions=60)
    counted.observe(frame.repartition(16)).write.format("noop").mode("overwrite").save()
    expected = frame.where("data IS NULL AND payload IS NOT NULL").groupBy("partition_id").count().collect()
    assert counted.unparsed() == {row.partition_id: row["count"] for row in expected}
    assert len(expected) == 60
