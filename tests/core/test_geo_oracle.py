"""Haversine distance and the brute-force kNN oracle, against independent computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from knnmon.geo import EARTH_RADIUS_M, haversine_m
from knnmon.oracle import BruteForceKnn


def test_haversine_known_values():
    quarter = math.pi / 2 * EARTH_RADIUS_M
    assert haversine_m(0, 0, 90, 0) == pytest.approx(quarter)
    assert haversine_m(0, 0, 0, 90) == pytest.approx(quarter)
    assert haversine_m(10, 90, -170, 90) == pytest.approx(0.0, abs=1e-6)        # the pole is one point
    assert haversine_m(179.9, 10, -179.9, 10) == pytest.approx(haversine_m(-0.1, 10, 0.1, 10))  # 180th meridian
    assert haversine_m(np.zeros(3), 0, np.array([0, 1, 2]), 0).shape == (3,)


def _slow_knn(rows, lon, lat, keywords, k):
    """Textbook oracle: every object, python loop, sort by (distance, id)."""
    scored = [(float(haversine_m(lon, lat, r["lon"], r["lat"])), r["id"]) for r in rows
              if set(r["keywords"]) & set(keywords)]
    return [(i, d) for d, i in sorted(scored)[:k]]


def test_oracle_ties_fewer_than_k_and_antimeridian():
    t = pa.table({
        "id": ["b", "a", "c", "d", "e"],
        "lon": [1.0, 1.0, -179.99, 179.99, 0.0],
        "lat": [0.0, 0.0, 0.0, 0.0, 89.9],
        "keywords": [["x"], ["x"], ["y"], ["y"], ["x", "y"]],
    })
    o = BruteForceKnn(t)
    assert [i for i, _ in o.knn(0.0, 0.0, ["x"], 2)] == ["a", "b"]          # tie broken by smaller id
    assert [i for i, _ in o.knn(0.0, 0.0, ["x"], 10)] == ["a", "b", "e"]     # fewer than k matches
    across = o.knn(180.0, 0.0, ["y"], 2)                                     # both ~1.1 km, across 180
    assert {i for i, _ in across} == {"c", "d"}
    assert [d for _, d in across] == pytest.approx([1111.95] * 2, rel=1e-4)
    assert o.knn(0.0, 0.0, ["zzz"], 3) == []


def test_oracle_matches_textbook_on_real_places(place_lines):
    from knnmon.keywords import normalize_keywords

    rows = []
    for line in place_lines("de", 3000):
        d = json.loads(line)
        c = d["properties"].get("classifiers") or []
        kw = normalize_keywords([x for cl in c for x in (cl.get("type"), cl.get("category"), cl.get("subcategory"))]
                                + (d["properties"].get("tags") or []))
        if kw:
            lon, lat = d["geometry"]["coordinates"]
            rows.append({"id": d["id"].split("@")[0], "lon": lon, "lat": lat, "keywords": kw})
    o = BruteForceKnn(pa.Table.from_pylist(rows))
    rng = np.random.default_rng(3)
    for r in rng.choice(rows, size=40, replace=False):
        kws = list(r["keywords"][:2])
        k = int(rng.integers(1, 12))
        got = o.knn(r["lon"], r["lat"], kws, k)
        want = _slow_knn(rows, r["lon"], r["lat"], kws, k)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert np.allclose([d for _, d in got], [d for _, d in want], rtol=1e-12)
