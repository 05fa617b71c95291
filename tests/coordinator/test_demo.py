"""``knnmon demo``: the README's main job, on the bundled sample, with exact kNN."""

from __future__ import annotations

import os

from knnmon.coordinator.demo import run_demo, sample_places_path
from knnmon.geo import haversine_m


def test_sample_ships_with_the_package():
    assert os.path.getsize(sample_places_path()) <= 5 * 1024 * 1024


def test_demo_runs_on_the_bundled_sample(spark, tmp_path, capsys):
    result = run_demo(str(tmp_path), n_queries=200, k_max=5, show=3)
    m = result["manifest"]
    assert m["records"]["read"] == 54_975 and m["records"]["kept"] > 54_000
    assert len(result["shown"]) == 3
    for q, knn in result["shown"]:
        assert 1 <= len(knn) <= q["k"]
        dists = [d for _, d in knn]
        assert dists == sorted(dists)
        assert dists[0] == 0.0 or haversine_m(q["lon"], q["lat"], q["lon"], q["lat"]) == 0.0
    out = capsys.readouterr().out
    assert "exact kNN of 3 queries" in out and result["shown"][0][1][0][0] in out
