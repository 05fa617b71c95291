"""Ranking candidates into kNN lists (:mod:`~knnmon.coordinator.runtime.nearest_first`), and a
window's parts merged by it where ids share their first 8 bytes and places share a point."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.coordinator.runtime.nearest_first import nearest_first
from knnmon.oracle import BruteForceKnn


@settings(max_examples=150, deadline=None)
@given(cands=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 9)), max_size=80),
       ks=st.lists(st.integers(0, 6), min_size=5, max_size=5), jit=st.booleans(), seed=st.integers(0, 2**16))
def test_each_query_keeps_its_k_nearest_distinct_objects_ties_by_key(cands, ks, jit, seed):
    """Against Python's sort: candidates (query, object) with distances and keys from a few values
    (many equal), an object found twice with the same distance and key (through two keywords)."""
    rng = np.random.default_rng(seed)
    d_of, key_of = rng.integers(0, 3, size=10).astype(float), rng.integers(0, 3, size=10).astype(np.uint64)
    q = np.array([c[0] for c in cands], dtype=np.int64)
    obj = np.array([c[1] for c in cands], dtype=np.int64)
    d = d_of[obj] + q  # (the same object: the same distance from the same query)
    key, k = key_of[obj], np.array(ks, dtype=np.int64)
    run = nearest_first if jit else nearest_first.py_func
    take, counts, tied = run(q, d, key, obj, k)
    at = 0
    for i in range(5):
        mine = sorted({(float(d[j]), int(key[j]), int(obj[j])) for j in np.flatnonzero(q == i)})
        want = mine[:k[i]]
        got = [(float(d[j]), int(key[j]), int(obj[j])) for j in take[at:at + counts[i]]]
        assert got == want and counts[i] == len(want)
        assert (q[take[at:at + counts[i]]] == i).all()
        head = mine[:k[i] + 1]
        assert tied[i] == any(a[:2] == b[:2] for a, b in zip(head, head[1:]))
        at += counts[i]
    assert at == len(take)


def test_parts_merge_ties_by_the_ids_where_their_first_8_bytes_are_equal(monkeypatch):
    """Tweet-like ids (long digit strings sharing a prefix) at a few shared points, sealed into
    several parts: each list equals the oracle's (ties at one distance ordered by the ids
    themselves, across parts), and each entry's row in the details is its own object."""
    from knnmon.coordinator.runtime import object_store
    from knnmon.coordinator.runtime.object_store import ObjectStore

    monkeypatch.setattr(object_store, "SEAL", 40)
    rng = np.random.default_rng(5)
    n = 390
    ids = [f"1700000{rng.integers(10**11, 10**12)}" for _ in range(n)]  # (8-byte prefixes: 10 values)
    spots = np.array([[-73.99, 40.73], [-73.98, 40.75], [-74.0, 40.7]])
    at = spots[rng.integers(0, 3, size=n)]
    objects = pa.table({"id": ids, "lon": at[:, 0], "lat": at[:, 1], "t": np.arange(n, dtype=np.int64) + 1,
                        "keywords": [["coffee"] if i % 3 else ["coffee", "tea"] for i in range(n)]})
    store = ObjectStore(objects.slice(0, 0), background=False)
    store.expire(0)  # (a window's store)
    for s in range(0, n - 30, 30):  # (rows 0..359 in 12 batches)
        store.append(objects.slice(s, 30))
        store.knn_v([0.0], [0.0], [["x"]], [1])  # parts seal as refills make them
    store.expire(100)
    store.append(objects.slice(n - 30))  # (the tail: one more part searched)
    live = objects.filter(pa.array(objects.column("t").to_numpy() > 100))
    assert len(store._parts) + bool(store._batches) >= 2
    oracle = BruteForceKnn(live)
    lon, lat = np.array([-73.99, -73.985, -74.0, -73.98]), np.array([40.73, 40.74, 40.7, 40.75])
    kws, k = [["coffee"], ["tea"], ["coffee", "tea"], ["tea"]], np.array([7, 25, 60, 3])
    settled = []
    settle = ObjectStore._settle_ties
    monkeypatch.setattr(ObjectStore, "_settle_ties",
                        staticmethod(lambda *a: settled.append(len(a[3])) or settle(*a)))
    topk, info = store.knn_v(lon, lat, kws, k)
    assert settled == [4]  # (every list has equal prefixes at one distance: ranked by the ids)
    for i in range(4):
        want = oracle.knn(lon[i], lat[i], kws[i], int(k[i]))
        assert [o for o, _ in topk[i]] == [o for o, _ in want]
        assert len({d for _, d in want}) < len(want)  # (ties at one distance decided by the ids)
    held = list(info)
    assert [held[r] for r in topk.rows] == list(topk.ids)
    # Objects left out (a revived worker's batch replayed): searched again for as many more.
    gone = frozenset(o for i in (0, 2) for o, _ in topk[i][:40:3])
    oracle = BruteForceKnn(live.filter(pa.array([o not in gone for o in live.column("id").to_pylist()])))
    topk, info = store.knn_v(lon, lat, kws, k, exclude=gone)
    for i in range(4):
        assert [o for o, _ in topk[i]] == [o for o, _ in oracle.knn(lon[i], lat[i], kws[i], int(k[i]))]
    assert [list(info.ids)[r] for r in topk.rows] == list(topk.ids)
    store.close()
