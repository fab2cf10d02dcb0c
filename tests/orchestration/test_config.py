"""The feeds file: clear, located errors for bad input."""
import pytest

from feedapi_dagster.orchestration.config import ConfigError, load_config

GOOD = """
lakehouse: lh
spark: {mode: local}
feeds:
  - name: orders
    url: https://feeds.example.com/orders
    token_env: ORDERS_TOKEN
"""


def write(tmp_path, text):
    path = tmp_path / "feeds.yaml"
    path.write_text(text)
    return path


def test_a_good_file_loads_and_resolves_the_lakehouse(tmp_path, monkeypatch):
    monkeypatch.delenv("FEEDAPI_LAKEHOUSE", raising=False)
    config = load_config(write(tmp_path, GOOD))
    assert config.lakehouse == str(tmp_path / "lh")
    assert config.table_path(config.feeds[0]) == str(tmp_path / "lh" / "orders")
    monkeypatch.setenv("FEEDAPI_LAKEHOUSE", "s3a://bucket/lake")
    assert load_config(write(tmp_path, GOOD)).lakehouse == "s3a://bucket/lake"


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("name: orders", "name: Orders-1"), r"feeds\[0\]\.name: feed name must match"),
    (GOOD.replace("token_env", "tokn_env"), r"feeds\[0\]\.tokn_env: unknown key"),
    (GOOD.replace("https://feeds", "ftp://feeds"), r"feeds\[0\]\.url: url must be an http"),
    (GOOD + "    dialect: v1\n", r"dialect v1 needs partition_count"),
    (GOOD + "    page_size_hint: zero\n", r"feeds\[0\]\.page_size_hint"),
    (GOOD.replace("mode: local", "mode: remote"), r"spark: .*sc://"),
    (GOOD + GOOD.split("feeds:\n")[1], r"feed names must be unique; repeated: orders"),
    ("feeds: [", r"not valid YAML"),
    ("- 1\n- 2\n", r"expected a mapping"),
])
def test_bad_files_name_the_file_and_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(write(tmp_path, text))
    assert "feeds.yaml" in str(caught.value)


def test_missing_file_and_missing_token_variable(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    monkeypatch.delenv("ORDERS_TOKEN", raising=False)
    feed = load_config(write(tmp_path, GOOD)).feeds[0]
    with pytest.raises(ConfigError, match="feed 'orders': environment variable ORDERS_TOKEN"):
        feed.client()
    monkeypatch.setenv("ORDERS_TOKEN", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(feed.client())
