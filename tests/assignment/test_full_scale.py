"""The assignment issue's claims at full scale (slow: ``pytest -m slow``): all places, 1 M queries, W = 12,
under the paper's load model (the model those claims are about)."""

from __future__ import annotations

import pytest

from knnmon.coordinator.planning import make_plan
from knnmon.ingest.jobs import ingest_places
from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
from knnmon.ingest.reading import read_objects

pytestmark = pytest.mark.slow


def test_proposed_beats_every_baseline_on_all_places(spark, shared_data, tmp_path):
    objects = tmp_path / "places"
    ingest_places([str(shared_data / "places")], str(objects))
    queries = tmp_path / "q.parquet"
    write_queries(generate_queries(read_objects(str(objects)), QueryWorkload(n=1_000_000, k_max=10, seed=0)),
                  str(queries))
    s = {a: make_plan(str(objects), str(queries), 12, a, cost_model="paper").summary
         for a in ("proposed", "keyword", "space", "random")}
    assert s["proposed"]["imbalance"] <= 1.10
    for base in ("keyword", "space", "random"):
        assert max(s["proposed"]["worker_loads"]) < max(s[base]["worker_loads"]), base
    assert s["proposed"]["deliveries_per_object"] < s["random"]["deliveries_per_object"]
