"""The paper's experiments (Tsuruoka et al. 2019, §5, Table 2) on knnmon's runtime: each
assignment's update time per batch and load imbalance as the workers, k_max and the number of
queries grow, the objects streamed in random order (stationary, as the load model assumes).

One benchmark is one plan and run (:func:`~knnmon.coordinator.bench.runner.run_bench`); its
``extra_info`` holds the paper's figures and the run is checked against the brute-force oracle
on a sample. ``single`` is the single-process reference (keyword lists, no assignment)."""

from __future__ import annotations

import pytest

from benchmarks.conftest import SCALE
from knnmon.coordinator.bench.runner import REFERENCE, BenchConfig, run_bench

#: What each benchmark reports (docs/benchmarks.md explains each).
FIGURES = ("update_ms_sim_mean", "update_ms_sim_p99", "update_ms_wall_mean", "imbalance_ms_mean", "objects_per_s",
           "deliveries_per_object", "spearman_predicted_vs_busy", "checked_queries", "startup_s", "worker_peak_rss_mb")


def bench_once(benchmark, objects_dir: str, *, algorithm: str, workers: int, kmax: int, queries: int) -> dict:
    """Plan and run one combination under ``benchmark``; its figures go to ``extra_info``.

    Raises
    ------
    AssertionError
        A checked result differs from the brute-force oracle's.
    """
    cfg = BenchConfig(objects=objects_dir, queries=(queries,), kmax=(kmax,), workers=(workers,),
                      algorithms=(algorithm,), initial=SCALE.initial, batches=SCALE.batches, shuffle=1,
                      check=True, check_sample=SCALE.check_sample)
    out = benchmark.pedantic(run_bench, args=(cfg,), kwargs={"progress": False, "log": lambda _: None},
                             rounds=1, iterations=1)
    (row,) = out["rows"]
    benchmark.extra_info.update({k: row[k] for k in FIGURES})
    assert row["exact"] is True, f"{row['mismatched_queries']} of {row['checked_queries']} queries differ"
    return row


@pytest.mark.parametrize("workers", SCALE.workers_sweep)
@pytest.mark.parametrize("algorithm", (*SCALE.sweep_algorithms, REFERENCE))
def test_workers(benchmark, objects_dir, ray_session, algorithm, workers):
    """Table 2, "number of workers": W grows, 100 k queries, k_max 10."""
    bench_once(benchmark, objects_dir, algorithm=algorithm, workers=workers, kmax=SCALE.kmax, queries=SCALE.queries)


@pytest.mark.parametrize("kmax", SCALE.kmax_sweep)
@pytest.mark.parametrize("algorithm", SCALE.sweep_algorithms)
def test_kmax(benchmark, objects_dir, ray_session, algorithm, kmax):
    """Table 2, "k_max": k uniform in [1, k_max]."""
    bench_once(benchmark, objects_dir, algorithm=algorithm, workers=SCALE.workers, kmax=kmax, queries=SCALE.queries)


@pytest.mark.parametrize("queries", SCALE.queries_sweep)
@pytest.mark.parametrize("algorithm", SCALE.sweep_algorithms)
def test_queries(benchmark, objects_dir, ray_session, algorithm, queries):
    """Table 2, "number of queries"."""
    bench_once(benchmark, objects_dir, algorithm=algorithm, workers=SCALE.workers, kmax=SCALE.kmax, queries=queries)
