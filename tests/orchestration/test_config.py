"""A defs.yaml's attributes: clear, located errors for bad input (`dg check defs` shows them with the
file and line: tests/orchestration/test_component.py)."""
import pytest
import yaml
from pydantic import ValidationError

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
    uri = FeedApiComponent(**dict(validate(GOOD.replace("lakehouse: lh", "lakehouse: s3a://bucket/lake"))))
    assert uri.project_config(tmp_path).lakehouse == "s3a://bucket/lake"


@pytest.mark.parametrize("text, location, message", [
    (GOOD.replace("name: orders", "name: Orders-1"), "feeds.0.name", "feed name must match"),
    (GOOD.replace("token_env", "tokn_env"), "feeds.0.tokn_env", "Extra inputs are not permitted"),
    (GOOD.replace("https://feeds", "ftp://feeds"), "feeds.0.url", "url must be an http"),
    (GOOD + "    dialect: v1\n", "feeds.0", "dialect v1 needs partition_count"),
    (GOOD + "    page_size_hint: zero\n", "feeds.0.page_size_hint", "valid integer"),
    (GOOD + "    token: '{{ env.X }}'\n", "feeds.0", "set token or token_env, not both"),
    (GOOD.replace("mode: local", "mode: remote"), "spark", "sc://"),
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
