"""A defs.yaml's attributes: clear, located errors for bad input (`dg check defs` shows them with the
file and line: tests/orchestration/test_component.py)."""

import dagster as dg
import pytest
import yaml
from dagster_pyspark import LazyPySparkResource
from pydantic import ValidationError

from feedapi_dagster.errors import StorageError
from feedapi_dagster.orchestration import (
    RESOURCE_KEY,
    FeedApiResource,
    FeedConfig,
    ProjectConfig,
    SparkResource,
    build_feedapi_definitions,
)
from feedapi_dagster.orchestration.component import FeedApiAttributes, FeedApiComponent
from feedapi_dagster.orchestration.loads import FeedBinding
from feedapi_dagster.orchestration.translator import table_column_schema
from feedapi_dagster.protocol import ProtocolError
from feedapi_dagster.spark.settings import SparkSettings

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


S3 = GOOD.replace(
    "lakehouse: lh",
    """lakehouse: s3a://lake/feeds
storage:
  s3:
    endpoint: http://127.0.0.1:9000
    path_style: true
    access_key_id_env: LAKE_KEY
    secret_access_key_env: LAKE_SECRET""",
).replace("mode: local", "mode: embedded")


def test_one_storage_setting_becomes_spark_s3a_settings_and_delta_rs_options(tmp_path, monkeypatch):
    project = FeedApiComponent(**dict(validate(S3))).project_config(tmp_path)
    monkeypatch.setenv("LAKE_KEY", "AKIA-test-key")
    monkeypatch.setenv("LAKE_SECRET", "s3cr3t-lake")
    settings = project.spark_settings()
    # the storage setting goes with the settings (variable names only), not into the server's conf
    assert settings.conf == {} and settings.s3 == project.s3
    assert "s3cr3t-lake" not in settings.model_dump_json() and "s3cr3t-lake" not in repr(project)
    # every session gets the s3a settings and the credentials, read when it is made; Hadoop's file
    # system cache stays on unless the storage asks for fresh file systems
    assert settings.s3.session_conf() == {
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.access.key": "AKIA-test-key",
        "fs.s3a.secret.key": "s3cr3t-lake",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }
    fresh_yaml = S3.replace("LAKE_SECRET", "LAKE_SECRET\n    fresh_file_systems: true")
    fresh = FeedApiComponent(**dict(validate(fresh_yaml))).project_config(tmp_path)
    assert fresh.s3.fresh_file_systems and not project.s3.fresh_file_systems
    assert fresh.spark_settings().s3.session_conf() == {
        **settings.s3.session_conf(),
        "fs.s3a.impl.disable.cache": "true",
    }
    assert fresh.storage_options() == project.storage_options()
    monkeypatch.setenv("LAKE_TOKEN", "t0ken")
    temporary = settings.s3.model_copy(update={"session_token_env": "LAKE_TOKEN"}).session_conf()
    assert temporary["fs.s3a.session.token"] == "t0ken"
    assert temporary["fs.s3a.aws.credentials.provider"] == "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    assert project.storage_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": "AKIA-test-key",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-lake",
    }
    # a cluster's sessions get the same; the resource of the runs carries the names, not the values
    remote = validate(S3.replace("mode: embedded", "mode: remote, remote: 'sc://spark:15002'"))
    remote_settings = FeedApiComponent(**dict(remote)).project_config(tmp_path).spark_settings()
    assert remote_settings.conf == {} and remote_settings.s3 == project.s3
    resource = SparkResource(settings=remote_settings)
    assert resource.spark_settings == remote_settings and resource.spark_settings.s3 == project.s3
    assert "s3cr3t-lake" not in str(resource)
    with pytest.raises(ValidationError, match="spark.s3 is set from storage.s3"):
        ProjectConfig(lakehouse="s3a://lake/feeds", spark=SparkSettings(s3=project.s3), feeds=project.feeds)
    monkeypatch.delenv("LAKE_SECRET")
    with pytest.raises(StorageError, match=r"LAKE_SECRET \(storage.s3.secret_access_key_env\) is not set"):
        project.storage_options()
    with pytest.raises(StorageError, match=r"LAKE_SECRET \(storage.s3.secret_access_key_env\) is not set"):
        settings.s3.session_conf()


@pytest.mark.parametrize(
    "text, location, message",
    [
        (GOOD.replace("name: orders", "name: Orders-1"), "feeds.0.name", "feed name must match"),
        (GOOD.replace("token_env", "tokn_env"), "feeds.0.tokn_env", "Extra inputs are not permitted"),
        (GOOD.replace("https://feeds", "ftp://feeds"), "feeds.0.url", "url must be an http"),
        (GOOD + "    dialect: v1\n", "feeds.0", "dialect v1 needs partition_count"),
        (GOOD + "    page_size_hint: zero\n", "feeds.0.page_size_hint", "valid integer"),
        (GOOD + "    layout: liquid\n", "feeds.0.layout", "'clustered', 'partitioned' or 'none'"),
        (GOOD + "    payload_form: typed\n", "feeds.0.payload_form", "'json', 'variant' or 'columns'"),
        (
            GOOD + "    payload_columns: {declared: {amount: NUMBER}}\n",
            "feeds.0.payload_columns.declared",
            "'NUMBER' names types Spark SQL has not: NUMBER",
        ),
        (GOOD + "    token: '{{ env.X }}'\n", "feeds.0", "set token or token_env, not both"),
        (GOOD.replace("mode: local", "mode: remote"), "spark", "sc://"),
        (S3.replace("http://127.0.0.1:9000", "127.0.0.1:9000"), "storage.s3.endpoint", "endpoint must be an http"),
        (S3.replace("    secret_access_key_env: LAKE_SECRET", ""), "storage.s3", "set access_key_id_env and secret"),
        (S3.replace("path_style: true", "path_styl: true"), "storage.s3.path_styl", "Extra inputs"),
        (S3.replace("s3a://lake", "s3://lake"), "Value error", "write s3a://lake/feeds"),
        (S3.replace("s3a://lake/feeds", "lh"), "Value error", "storage.s3 is set but the lakehouse 'lh'"),
        # two Spark drivers (a run process each) could commit one version of a table on S3
        (S3.replace("mode: embedded", "mode: local"), "Value error", "keeps two commits of one table version apart"),
    ],
)
def test_bad_attributes_name_the_key(text, location, message):
    with pytest.raises(ValidationError) as caught:
        validate(text)
    report = str(caught.value)
    assert location in report and message in report, report


def test_a_feeds_layout_is_what_its_runs_table_is_created_with_and_checked_against(tmp_path):
    project = FeedApiComponent(**dict(validate(GOOD + "    layout: partitioned\n"))).project_config(tmp_path)
    binding = FeedBinding(project, project.feeds[0], dg.AssetKey("orders"))
    assert binding.table_for(spark=None).layout == "partitioned"  # type: ignore[arg-type]  # no Spark call
    unset = FeedApiComponent(**dict(validate(GOOD))).project_config(tmp_path)
    assert FeedBinding(unset, unset.feeds[0], dg.AssetKey("orders")).table_for(spark=None).layout is None  # type: ignore[arg-type]


def test_a_feeds_payload_form_is_its_tables_and_its_assets_columns(tmp_path):
    project = FeedApiComponent(**dict(validate(GOOD + "    payload_form: variant\n"))).project_config(tmp_path)
    binding = FeedBinding(project, project.feeds[0], dg.AssetKey("orders"))
    assert binding.table_for(spark=None).payload_form == "variant"  # type: ignore[arg-type]  # no Spark call
    assert [c.name for c in table_column_schema("variant").columns][-1] == "data"
    unset = FeedApiComponent(**dict(validate(GOOD))).project_config(tmp_path)
    assert unset.feeds[0].payload_form == "json"  # the default: today's table
    assert "data" not in [c.name for c in table_column_schema(unset.feeds[0].payload_form).columns]
    # a columns feed's settings reach its table: the payload's text kept unless the feed says not
    columns = GOOD + "    payload_form: columns\n    payload_columns: {evolution: rescue, keep_payload: false}\n"
    project = FeedApiComponent(**dict(validate(columns))).project_config(tmp_path)
    table = FeedBinding(project, project.feeds[0], dg.AssetKey("orders")).table_for(spark=None)  # type: ignore[arg-type]
    assert (table.columns.evolution, table.columns.keep_payload) == ("rescue", False)
    assert unset.feeds[0].payload_columns.settings().keep_payload is True


def test_duplicate_feed_names_and_a_missing_token_variable(tmp_path, monkeypatch):
    twice = GOOD + GOOD.split("feeds:\n")[1]
    with pytest.raises(ValidationError, match="feed names must be unique; repeated: orders"):
        FeedApiComponent(**dict(validate(twice))).project_config(tmp_path)
    monkeypatch.delenv("ORDERS_TOKEN", raising=False)
    feed = validate(GOOD).feeds[0]
    with pytest.raises(ProtocolError, match="feed 'orders': environment variable ORDERS_TOKEN"):
        feed.client()
    monkeypatch.setenv("ORDERS_TOKEN", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(feed.client())
    inline = validate(GOOD.replace("token_env: ORDERS_TOKEN", "token: s3cr3t-inline")).feeds[0]
    assert "s3cr3t-inline" not in repr(inline) and "s3cr3t-inline" not in str(inline.model_dump())
    assert inline.bearer_token() == "s3cr3t-inline"


def test_the_resources_hold_the_spark_settings_and_take_a_users_dagster_pyspark_resource(tmp_path):
    settings = SparkSettings(mode="remote", remote="sc://spark:15002", conf={"spark.sql.shuffle.partitions": 2})
    assert SparkResource(settings=settings).spark_settings == settings
    assert SparkResource(settings={"mode": "local"}).spark_settings == SparkSettings(mode="local")
    with pytest.raises(ValidationError, match="needs `remote`"):
        SparkResource(settings={"mode": "remote"})
    orders = ProjectConfig(lakehouse=str(tmp_path), feeds=[FeedConfig(name="orders", url="https://x.example/f")])
    audit = orders.model_copy(update={"feeds": [FeedConfig(name="audit", url="https://x.example/a")]})
    # the same Spark settings: one resource, so that two components' (or factories') Definitions merge
    resource = build_feedapi_definitions(orders).resources[RESOURCE_KEY]
    assert resource is build_feedapi_definitions(audit).resources[RESOURCE_KEY]
    assert resource.spark.spark_settings == orders.spark_settings()
    dg.Definitions.validate_loadable(
        dg.Definitions.merge(build_feedapi_definitions(orders), build_feedapi_definitions(audit))
    )
    users = LazyPySparkResource(spark_config={"spark.app.name": "user"})
    assert build_feedapi_definitions(orders, spark=users).resources[RESOURCE_KEY].spark is users

    class NoSpark(dg.ConfigurableResource):
        pass

    with pytest.raises(ValidationError, match="must give a `spark_session`"):
        FeedApiResource(spark=NoSpark())
