"""A lakehouse on S3 that Spark cannot use: the error names the setting to change, with Spark's first
line, not a stack trace from deep in Hadoop. Real Spark against the test S3 server; each case on a
bucket of its own, so that the file system Spark caches for the tests' bucket is not the one broken."""

import pytest

from feedapi_dagster.errors import StorageError
from feedapi_dagster.lakehouse.feed_table import FeedTable


@pytest.fixture
def broken(spark, s3_server, s3_storage):
    """Session settings that break s3a for one new bucket, removed afterwards (the session is shared)."""
    changed = []

    def make(bucket: str, **settings: str) -> FeedTable:
        s3_server.create_bucket(bucket)
        for key, value in settings.items():
            spark.conf.set(key, value)
            changed.append(key)
        return FeedTable(spark, f"s3a://{bucket}/feed", storage_options=s3_storage.storage_options())

    yield make
    for key in changed:
        spark.conf.unset(key)


def test_missing_credentials_name_the_settings(broken):
    # session credentials from the Hadoop configuration only, where there are none
    table = broken(
        "nocreds",
        **{
            "fs.s3a.bucket.nocreds.aws.credentials.provider": "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        },
    )
    with pytest.raises(StorageError) as caught:
        table.ensure_table()
    message = str(caught.value)
    assert "s3a://nocreds/feed: no AWS credentials" in message and "storage.s3.access_key_id_env" in message
    assert "\tat " not in message and "\n" not in message  # no stack trace


def test_refused_credentials_say_so(broken):
    table = broken(
        "anonymous",
        **{
            "fs.s3a.bucket.anonymous.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
        },
    )
    with pytest.raises(StorageError, match="s3a://anonymous/feed: S3 refused the credentials"):
        table.ensure_table()


def test_a_spark_without_the_s3a_jars_says_how_to_get_them(broken):
    # what a Spark without hadoop-aws on its classpath says: the class of the s3a file system is missing
    table = broken("nojars", **{"fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystemNotOnTheClasspath"})
    with pytest.raises(StorageError) as caught:
        table.ensure_table()
    message = str(caught.value)
    assert "no s3a file system" in message and "feedapi-dagster setup-jars" in message and "hadoop-aws" in message
    assert "\tat " not in message
