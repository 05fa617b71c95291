"""The one reader of results (knnmon.results) against a real Redis holding the layout a worker's
writer makes: chunked reads in order, missing queries, details found, missing or malformed, and a
query hash that names another namespace's details hash."""

from __future__ import annotations

import pytest

from knnmon.batch import ObjectInfo
from knnmon.connection import connect
from knnmon.keys import Keys
from knnmon.results import ResultReader, StoredQuery


@pytest.fixture
def stored(redis_url, namespace):
    client, keys = connect(redis_url), Keys(namespace)
    details = keys.objects(1)
    for i in range(5):
        qid = f"q{i}"
        client.hset(keys.query(qid), mapping={"lon": 10 + i, "lat": 50.5, "keywords": "coffee tea", "k": 2,
                                              "worker": 1, "objects": details})
        client.zadd(keys.result(qid), {f"o{i}a": 10.0 * i, f"o{i}b": 10.0 * i + 0.5})
    client.hset(details, mapping={"o0a": ObjectInfo(10.0, 50.0, 1000, ("coffee",)).to_text(), "o0b": "not details"})
    yield client, keys
    for key in client.scan_iter(f"{namespace}:*", count=10_000):
        client.delete(key)
    client.close()


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_many_reads_every_query_in_order_in_chunks(stored, chunk):
    client, keys = stored
    qids = ["q3", "missing", "q0", "q4", "q1"]
    got = list(ResultReader(client, keys, chunk=chunk).many(qids, hashes=True))
    assert [q for q, _, _ in got] == qids
    assert got[1][1] == {} and got[1][2] == []
    assert got[0][1]["lon"] == "13" and got[0][2] == [("o3a", 30.0), ("o3b", 30.5)]
    only_hashes = list(ResultReader(client, keys, chunk=chunk).many(qids, hashes=True, results=False))
    assert [(q, h) for q, h, _ in only_hashes] == [(q, h) for q, h, _ in got] and all(r is None for *_, r in only_hashes)


def test_read_types_the_query_and_each_neighbours_details(stored, redis_url):
    client, keys = stored
    reader = ResultReader(client, keys, url=redis_url)
    r = reader.read("q0")
    assert r.query.as_dict() == {"id": "q0", "lon": 10.0, "lat": 50.5, "keywords": ["coffee", "tea"], "k": 2,
                                 "worker": 1}
    (a, b) = r.knn
    assert (a.id, a.distance_m, a.lon, a.lat, a.t, a.keywords) == ("o0a", 0.0, 10.0, 50.0, 1000, ["coffee"])
    assert (b.id, b.distance_m, b.lon, b.keywords) == ("o0b", 0.5, None, None)  # malformed details: none
    assert r.radius_m == 0.5 and reader.last("q0") == ("o0b", 0.5)
    assert reader.read("missing") is None and reader.last("missing") is None
    client.hset(keys.query("q1"), "k", 5)
    assert reader.read("q1").radius_m is None  # fewer than k: r_q unbounded


def test_a_details_key_outside_the_namespace_is_never_read(stored):
    client, keys = stored
    q = StoredQuery.of("q0", {"worker": "3", "objects": "other:objects:3"}, keys)
    assert q.objects == keys.objects("3")
    assert StoredQuery.of("q0", {"objects": "other:objects:3"}, keys).objects is None
    assert StoredQuery.of("q0", {"k": "x", "lon": "nan?"}, keys).k is None


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_lists_read_queries_and_results_in_columns_as_many_does(stored, chunk):
    """:meth:`ResultReader.lists` (one script call per chunk) reads what :meth:`many` reads:
    the queries' parameters and results in order, absent ids apart."""
    client, keys = stored
    qids = ["q3", "missing", "q0", "q4", "q1"]
    got = ResultReader(client, keys, chunk=chunk).lists(qids)
    want = [(q, h, r) for q, h, r in ResultReader(client, keys).many(qids, hashes=True) if h]
    assert got.absent == ["missing"]
    assert list(got.queries.ids) == [q for q, _, _ in want]
    assert got.queries.lon.tolist() == [float(h["lon"]) for _, h, _ in want]
    assert got.queries.lat.tolist() == [float(h["lat"]) for _, h, _ in want]
    assert [list(w) for w in got.queries.keywords] == [h["keywords"].split() for _, h, _ in want]
    assert got.queries.k.tolist() == [int(h["k"]) for _, h, _ in want]
    assert got.results() == [r for _, _, r in want]


def test_lists_on_a_cluster_read_the_same(redis_cluster_url, namespace):
    """On a Redis Cluster (a chunk's keys in many slots: no script) the same columns."""
    client, keys = connect(redis_cluster_url), Keys(namespace)
    try:
        for i in range(30):
            client.hset(keys.query(f"q{i}"), mapping={"lon": i / 3, "lat": -i, "keywords": "a b", "k": 3})
            if i % 4:
                client.zadd(keys.result(f"q{i}"), {f"o{j}": j / 7 + i for j in range(i % 4)})
        qids = [f"q{i}" for i in range(30)] + ["gone"]
        got = ResultReader(client, keys, chunk=7).lists(qids)
        assert got.absent == ["gone"] and list(got.queries.ids) == qids[:30]
        assert got.queries.lon.tolist() == [i / 3 for i in range(30)] and got.queries.k.tolist() == [3] * 30
        assert got.results() == [[(f"o{j}", j / 7 + i) for j in range(i % 4)] for i in range(30)]
    finally:
        for i in range(30):
            client.delete(keys.query(f"q{i}"), keys.result(f"q{i}"))
        client.close()


def test_lists_refuse_a_query_hash_without_its_parameters(stored):
    client, keys = stored
    client.hdel(keys.query("q2"), "lat")
    with pytest.raises(ValueError, match="lon, lat, keywords and k"):
        ResultReader(client, keys).lists(["q1", "q2"])
