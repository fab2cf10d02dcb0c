"""A defs.yaml's attributes: clear, located errors for bad input (`dg check defs` shows them with the
file and line: tests/orchestration/test_component.py)."""
import pytest
import yaml
from pydantic import ValidationError

from feedapi_dagster.lakehouse.storage import StorageError
from feedapi_dagster.protocol import FeedAPIError
from feedapi_dagster.orchestration.component import FeedApiAttributes, FeedApiComponent

GOOD = """
lakehouse: lh
spark: {mode: local}
feeds:
  - name: orders
    url: https://feeds.example.com/orders
    token_env: ORDERS_TOKEN
"""


def validate(text: str) -> FeedApiAttributes:
    return FeedApiAttributes.model_validate(yaml.safe_load(text))


def test_good_attributes_resolve_the_lakehouse_against_the_project_root(tmp_path):
    component = FeedApiComponent(**dict(validate(GOOD)))
    project = component.project_config(tmp_path)
    assert project.table_path(project.feeds[0]) == str(tmp_path / "lh" / "orders")
    on_s3 = GOOD.replace("lakehouse: lh", "lakehouse: s3a://bucket/lake").replace("mode: local", "mode: embedded")
    uri = FeedApiComponent(**dict(validate(on_s3)))
    assert uri.project_config(tmp_path).lakehouse == "s3a://bucket/lake"


S3 = GOOD.replace("lakehouse: lh", """lakehouse: s3a://lake/feeds
storage:
  s3:
    endpoint: http://127.0.0.1:9000
    path_style: true
    access_key_id_env: LAKE_KEY
    secret_access_key_env: LAKE_SECRET""").replace("mode: local", "mode: embedded")


def test_one_storage_setting_becomes_spark_s3a_settings_and_delta_rs_options(tmp_path, monkeypatch):
    project = FeedApiComponent(**dict(validate(S3))).project_config(tmp_path)
    monkeypatch.setenv("LAKE_KEY", "AKIA-test-key")
    monkeypatch.setenv("LAKE_SECRET", "s3cr3t-lake")
    settings = project.spark_settings()
    assert settings.conf == {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
                             "spark.hadoop.fs.s3a.path.style.access": "true",
                             "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
                             "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
    # credentials reach the Spark JVM started here by the names of variables, never in its conf
    assert settings.credential_env == {"AWS_ACCESS_KEY_ID": "LAKE_KEY", "AWS_SECRET_ACCESS_KEY": "LAKE_SECRET"}
    assert "s3cr3t-lake" not in settings.model_dump_json() and "s3cr3t-lake" not in repr(project)
    assert project.storage_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "AWS_ACCESS_KEY_ID": "AKIA-test-key",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-lake"}
    # a cluster gets them as settings of its session (its Hadoop configuration of reads and writes)
    remote = validate(S3.replace("mode: embedded", "mode: remote, remote: 'sc://spark:15002'"))
    remote_conf = FeedApiComponent(**dict(remote)).project_config(tmp_path).spark_settings().conf
    assert remote_conf["fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    monkeypatch.delenv("LAKE_SECRET")
    with pytest.raises(StorageError, match=r"LAKE_SECRET \(storage.s3.secret_access_key_env\) is not set"):
        project.storage_options()


@pytest.mark.parametrize("text, location, message", [
    (GOOD.replace("name: orders", "name: Orders-1"), "feeds.0.name", "feed name must match"),
    (GOOD.replace("token_env", "tokn_env"), "feeds.0.tokn_env", "Extra inputs are not permitted"),
    (GOOD.replace("https://feeds", "ftp://feeds"), "feeds.0.url", "url must be an http"),
    (GOOD + "    dialect: v1\n", "feeds.0", "dialect v1 needs partition_count"),
    (GOOD + "    page_size_hint: zero\n", "feeds.0.page_size_hint", "valid integer"),
    (GOOD + "    token: '{{ env.X }}'\n", "feeds.0", "set token or token_env, not both"),
    (GOOD.replace("mode: local", "mode: remote"), "spark", "sc://"),
    (S3.replace("http://127.0.0.1:9000", "127.0.0.1:9000"), "storage.s3.endpoint", "endpoint must be an http"),
    (S3.replace("    secret_access_key_env: LAKE_SECRET", ""), "storage.s3", "set access_key_id_env and secret"),
    (S3.replace("path_style: true", "path_styl: true"), "storage.s3.path_styl", "Extra inputs"),
    (S3.replace("s3a://lake", "s3://lake"), "Value error", "write s3a://lake/feeds"),
    (S3.replace("s3a://lake/feeds", "lh"), "Value error", "storage.s3 is set but the lakehouse 'lh'"),
    # two Spark drivers (a run process each) could commit one version of a table on S3
    (S3.replace("mode: embedded", "mode: local"), "Value error", "keeps two commits of one table version apart"),
])
def test_bad_attributes_name_the_key(text, location, message):
    with pytest.raises(ValidationError) as caught:
        validate(text)
    report = str(caught.value)
    assert location in report and message in report, report


def test_duplicate_feed_names_and_a_missing_token_variable(tmp_path, monkeypatch):
    twice = GOOD + GOOD.split("feeds:\n")[1]
    with pytest.raises(ValidationError, match="feed names must be unique; repeated: orders"):
        FeedApiComponent(**dict(validate(twice))).project_config(tmp_path)
    monkeypatch.delenv("ORDERS_TOKEN", raising=False)
    feed = validate(GOOD).feeds[0]
    with pytest.raises(FeedAPIError, match="feed 'orders': environment variable ORDERS_TOKEN"):
        feed.client()
    monkeypatch.setenv("ORDERS_TOKEN", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(feed.client())
    inline = validate(GOOD.replace("token_env: ORDERS_TOKEN", "token: s3cr3t-inline")).feeds[0]
    assert "s3cr3t-inline" not in repr(inline) and "s3cr3t-inline" not in str(inline.model_dump())
    assert inline.bearer_token() == "s3cr3t-inline"
