"""``knnmon bench``: a small run on real places, report structure, exactness, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pyarrow as pa

from knnmon.coordinator.bench.plots import plot_report
from knnmon.coordinator.bench.runner import BenchConfig, _check_sample, run_bench, spearman
from knnmon.coordinator.cli import main

from knnmon.errors import InputPathError, InvalidArgumentError

ROW_KEYS = {"algorithm", "workers", "kmax", "queries", "update_ms_wall_mean", "update_ms_sim_mean",
            "update_ms_sim_p99", "imbalance_ms_mean", "objects_per_s", "deliveries_per_object", "exact",
            "spearman_predicted_vs_busy", "busy_ms_per_worker", "predicted_worker_loads"}


@pytest.mark.parametrize("kmax", [(3,), pytest.param((3, 6), marks=pytest.mark.slow)], ids=["k3", "k3-k6"])
# (both k_max: -m slow, 40 s of a default suite that must stay under 10 minutes)
def test_small_bench_is_exact_for_every_algorithm(places_slice, redis_url, ray_instance, tmp_path, kmax):
    report = tmp_path / "bench.json"
    cfg = BenchConfig(objects=str(places_slice), queries=(600,), kmax=kmax, workers=(2,),
                      algorithms=("proposed", "keyword", "space", "random", "ideal", "single"), initial=7000, batch=500,
                      batches=4, check=True, redis_url=redis_url)
    out = run_bench(cfg, str(report), progress=False, log=lambda _: None)
    saved = json.loads(report.read_text())
    assert saved["rows"] == json.loads(json.dumps(out["rows"]))
    assert saved["machine"]["cpus"] >= 1 and saved["machine"]["speed_probe_ms"] > 0 and not saved["interrupted"]
    rows = saved["rows"]
    assert [(r["algorithm"], r["kmax"]) for r in rows] == [
        (a, k) for k in kmax for a in ("proposed", "keyword", "space", "random", "ideal", "single")]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["exact"] is True and r["mismatched_queries"] == 0 and r["checked_queries"] == 600, r["algorithm"]
        assert r["queries"] == 600 and r["objects"] == 2000 and r["batches"] == 4
        assert r["update_ms_sim_mean"] > 0 and (r["objects_per_s"] or 0) > 0 or r["algorithm"] == "ideal"
        assert len(r["speed_probe_ms"]) == 2 and min(r["speed_probe_ms"]) > 0
        assert len(r["busy_ms_per_worker"]) == (1 if r["algorithm"] == "single" else 2)
        assert r["routing"]["routing_table_bytes"] > 0 and r["routing"]["routing_pairs_promoted"] == 0
    assert all(r["workers"] == 1 and 0 < r["deliveries_per_object"] <= 1 for r in rows if r["algorithm"] == "single")
    for r in (x for x in rows if x["algorithm"] == "ideal"):  # the bound: one worker's run, its work shared by 2
        assert r["ideal_from"] == {"workers": 1, "batches": 4} and r["objects_per_s"] is None
        assert 0 < r["deliveries_per_object"] <= 1 and r["slowest_over_mean_busy"] == 1.0
        share = np.asarray(r["busy_ms_per_batch"])
        assert share.shape == (4, 2) and (share == share[:, :1]).all() and (share >= r["fixed_ms"]).all()
        assert r["fixed_ms"] >= 0
        assert r["update_ms_sim_mean"] == pytest.approx(np.mean(r["route_cpu_ms_per_batch"]) + share[:, 0].mean())
        same_k = [x for x in rows if x["kmax"] == r["kmax"] and x["algorithm"] not in ("ideal", "single")]
        assert r["deliveries_per_object"] <= min(x["deliveries_per_object"] for x in same_k)
        assert r["route_cpu_ms_mean"] == pytest.approx(min(x["route_cpu_ms_mean"] for x in same_k))  # W calls a batch
    swept = rows if len(kmax) > 1 else rows + [{**r, "kmax": 6} for r in rows]  # (one k_max: a sweep to plot)
    paths = plot_report(swept, str(tmp_path / "plots"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["update_vs_kmax.png"]
    assert (tmp_path / "plots" / "update_vs_kmax.png").stat().st_size > 10_000


def test_check_sample_draws_distinct_queries_reproducibly():
    queries = pa.table({"id": [f"q{i}" for i in range(600)], "k": list(range(600))})
    part = _check_sample(queries, 50, seed=3)
    ids = part.column("id").to_pylist()
    assert len(set(ids)) == 50 and set(ids) < set(queries.column("id").to_pylist())
    assert ids == _check_sample(queries, 50, seed=3).column("id").to_pylist()
    assert ids != _check_sample(queries, 50, seed=4).column("id").to_pylist()
    assert _check_sample(queries, None, seed=3) is queries and _check_sample(queries, 600, seed=3) is queries


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_bad_input_fails_before_any_work(places_slice, tmp_path, capsys):
    base = {"objects": str(places_slice), "queries": (10,)}
    with pytest.raises(InvalidArgumentError, match="Invalid algorithm"):
        BenchConfig(**base, algorithms=("proposed", "fastest"))
    with pytest.raises(InvalidArgumentError, match="--workers"):
        BenchConfig(**base, workers=(0, 4))
    with pytest.raises(InvalidArgumentError, match="bench.check_sample"):
        BenchConfig(**base, check=True, check_sample=0)
    with pytest.raises(InputPathError, match="not an ingest output"):
        BenchConfig(objects=str(tmp_path / "missing"), queries=(10,))
    with pytest.raises(InvalidArgumentError, match="exceeds the 10,000 objects"):
        run_bench(BenchConfig(**{**base, "queries": (10_001,)}), None, progress=False)
    assert main(["bench", "--objects", str(places_slice), "--queries", "10", "--algorithms", "nope"]) == 2
    assert "Invalid algorithm" in capsys.readouterr().err
    assert main(["bench", "--objects", str(places_slice), "--queries", "ten"]) == 2
    assert "bench.queries = 'ten' (--queries): Input should be a valid integer" in capsys.readouterr().err


def test_the_cost_fit_recovers_known_costs():
    """cost_fit: busy times made from known per-batch, per-object, per-candidate and per-change
    costs give them back; a cost the data make negative is dropped (0); too few samples: None."""
    from knnmon.coordinator.bench.ideal import cost_fit

    rng = np.random.default_rng(0)

    def rows(per_candidate: float):
        out = []
        for _ in range(2):
            objects, candidates, changed = (rng.integers(0, n, size=(20, 4)) for n in (500, 5000, 100))
            busy = 2.7 + 0.004 * objects + per_candidate * candidates + 0.03 * changed
            out.append({"busy_ms_per_batch": busy.tolist(),
                        "per_worker_per_batch": np.stack([objects, candidates, changed], axis=1).tolist()})
        return out

    assert cost_fit(rows(4e-5)) == pytest.approx([2.7, 0.004, 4e-5, 0.03])
    assert cost_fit(rows(-1e-4))[2] == 0.0
    assert cost_fit([{"busy_ms_per_batch": [[1.0]], "per_worker_per_batch": [[[1], [1], [1]]]}]) is None
