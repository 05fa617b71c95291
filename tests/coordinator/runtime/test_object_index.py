"""The object kNN index: exact against the brute-force oracle, serial and forked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from knnmon.ingest.reading import read_objects
from knnmon.oracle import BruteForceKnn
from knnmon.coordinator.runtime.object_index import ObjectIndex


def as_lists(idx, counts, dist, ids):
    out, start = [], 0
    for c in counts:
        out.append([(str(ids[i]), float(d)) for i, d in zip(idx[start:start + c], dist[start:start + c])])
        start += c
    return out


def test_equals_the_oracle_on_real_places(places_slice):
    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    index, oracle = ObjectIndex(objects), BruteForceKnn(objects)
    rng = np.random.default_rng(2)
    rows = objects.take(pa.array(rng.choice(objects.num_rows, 400, replace=False))).to_pylist()
    words = list(index.vocabulary)
    kws = [r["keywords"][:2] + ([words[i]] if i % 3 == 0 else []) for i, r in enumerate(rows)]  # OR of 1-3
    k = rng.integers(1, 25, size=len(rows))
    lon = np.array([r["lon"] for r in rows]) + rng.normal(0, 0.01, len(rows))
    lat = np.array([r["lat"] for r in rows]) + rng.normal(0, 0.01, len(rows))
    got = as_lists(*index.knn_v(lon, lat, kws, k), index.ids)
    for i in range(len(rows)):
        want = oracle.knn(lon[i], lat[i], kws[i], int(k[i]))
        assert [g[0] for g in got[i]] == [w[0] for w in want]
        assert [g[1] for g in got[i]] == pytest.approx([w[1] for w in want], rel=1e-12)
    r = index.kth_distance_m(lon, lat, kws, k)
    for i in range(len(rows)):
        assert r[i] == (got[i][-1][1] if len(got[i]) == k[i] else np.inf)


def test_a_tree_budget_drops_trees_and_answers_stay_exact(places_slice, monkeypatch):
    """Trees beyond the budget (least recently used first) and after drop_trees are built again
    on use; every answer equals the unbounded index's."""
    import knnmon.coordinator.runtime.object_index as object_index

    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    free, bounded = ObjectIndex(objects), ObjectIndex(objects)
    rng = np.random.default_rng(5)
    rows = objects.take(pa.array(rng.choice(objects.num_rows, 300, replace=False))).to_pylist()
    lon, lat = np.array([r["lon"] for r in rows]), np.array([r["lat"] for r in rows])
    kws, k = [r["keywords"][:3] for r in rows], rng.integers(1, 12, size=len(rows))
    want = as_lists(*free.knn_v(lon, lat, kws, k), free.ids)
    monkeypatch.setattr(object_index, "TREE_BUDGET", 300)
    for half in (slice(0, 150), slice(150, 300), slice(0, 300)):
        got = as_lists(*bounded.knn_v(lon[half], lat[half], kws[half], k[half]), bounded.ids)
        assert got == want[half]
        assert bounded._tree_entries <= 300 or len(bounded._trees) == 1
        assert bounded._tree_entries == sum(len(bounded.postings(w)) for w in bounded.vocabulary
                                            if bounded.code_of(w) in bounded._trees)
    assert len(free._trees) > len(bounded._trees)
    bounded.drop_trees()
    assert not bounded._trees and bounded._tree_entries == 0
    assert as_lists(*bounded.knn_v(lon, lat, kws, k), bounded.ids) == want


def test_forked_equals_serial(places_slice):
    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    index = ObjectIndex(objects)
    rng = np.random.default_rng(4)
    rows = objects.take(pa.array(rng.integers(0, objects.num_rows, 25_000))).to_pylist()
    args = (np.array([r["lon"] for r in rows]), np.array([r["lat"] for r in rows]),
            pa.array([r["keywords"][:1] for r in rows]), rng.integers(1, 8, len(rows)))
    serial = index.knn_v(*args)
    forked = index.knn_v(*args, processes=2)
    for a, b in zip(serial, forked):
        assert np.array_equal(a, b)


def test_ties_fewer_than_k_antimeridian_and_poles():
    t = pa.table({
        "id": ["b", "a", "c", "w", "e", "p1", "p2"],
        "lon": [10.0, 10.0, 10.001, -179.999, 179.999, 0.0, 180.0],
        "lat": [45.0, 45.0, 45.0, 0.0, 0.0, 89.999, 89.999],
        "keywords": [["x"], ["x"], ["x", "y"], ["z"], ["z"], ["pole"], ["pole"]],
    })
    index, oracle = ObjectIndex(t), BruteForceKnn(t)
    cases = [(10.0, 45.0, ["x"], 2), (10.0, 45.0, ["y"], 5), (180.0, 0.0, ["z"], 1), (90.0, 90.0, ["pole"], 2),
             (0.0, 0.0, ["nothing"], 3)]
    got = as_lists(*index.knn_v([c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases],
                                [c[3] for c in cases]), index.ids)
    assert [g[0] for g in got[0]] == ["a", "b"]            # tie at distance 0, smaller id first
    assert [g[0] for g in got[1]] == ["c"]                  # fewer than k
    assert got[2][0][1] == pytest.approx(111.19, rel=1e-3)  # across the 180th meridian
    assert len(got[3]) == 2 and got[3][0][1] == pytest.approx(got[3][1][1])
    assert got[4] == []
    for case, g in zip(cases, got):
        assert [x[0] for x in g] == [x[0] for x in oracle.knn(case[0], case[1], case[2], case[3])]
