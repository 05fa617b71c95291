"""``knnmon demo``: the README's main job, on the bundled sample, through Ray and Redis."""

from __future__ import annotations

import os

from knnmon.coordinator.cli.demo import run_demo, sample_places_path


def test_sample_ships_with_the_package():
    assert os.path.getsize(sample_places_path()) <= 5 * 1024 * 1024


def test_demo_runs_on_the_bundled_sample(spark, ray_instance, tmp_path, capsys):
    result = run_demo(str(tmp_path), n_queries=300, k_max=5, show=3)
    m, s = result["manifest"], result["summary"]
    assert m["records"]["read"] == 54_975 and m["records"]["kept"] > 54_000
    assert s.objects + s.initial_objects == m["records"]["kept"] and s.results_changed > 0
    assert len(result["shown"]) == 3
    for q, knn, exact in result["shown"]:
        assert exact and 1 <= len(knn) <= q["k"]
        assert [o["distance_m"] for o in knn] == sorted(o["distance_m"] for o in knn)
    out = capsys.readouterr().out
    assert "equals the brute-force kNN" in out and result["shown"][0][1][0]["id"] in out
    assert os.path.exists(tmp_path / "data" / "redis" / "knnmon.rdb")  # saved for `knnmon results`
