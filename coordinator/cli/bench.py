"""``knnmon bench``: the paper's experiments on the real runtime (:mod:`knnmon.coordinator.bench`)."""

from __future__ import annotations

from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.coordinator.bench.ideal import IDEAL
from knnmon.coordinator.bench.runner import REFERENCE
from knnmon.coordinator.cli.options import add_config_options, add_verb, require, setting_flag, settings_of
from knnmon.errors import InvalidArgumentError

__all__ = ["add_bench_command"]


def _num(value: float | None, fmt: str) -> str:
    """``value`` formatted, or ``-`` right-aligned to the width (a column the row does not have:
    the ideal's wall time and throughput, a Spearman of fewer than 3 workers)."""
    width = int(fmt.split(".")[0].replace(",", "") or 0)
    return f"{'-':>{width}s}" if value is None else format(value, fmt)


def _bench(a: Any) -> int:
    from knnmon.coordinator.bench.plots import plot_report
    from knnmon.coordinator.bench.runner import BenchConfig, run_bench

    s = settings_of(a).settings
    b, r = s.bench, s.run
    require(r.objects, "run.objects", "--objects")
    if not b.queries:
        raise InvalidArgumentError("--queries is required (or the setting bench.queries)")
    cfg = BenchConfig(objects=r.objects, queries=tuple(b.queries), kmax=tuple(b.kmax), workers=tuple(b.workers),
                      algorithms=tuple(b.algorithms), initial=r.initial, batch=r.batch, batches=r.batches,
                      repeat=b.repeat, shuffle=r.shuffle, cost_model=s.plan.cost_model,
                      check=b.check or b.check_sample is not None, check_sample=b.check_sample,
                      seed=b.seed, redis_url=s.redis.url, namespace=b.namespace, ray_address=s.workers.ray_address,
                      window=s.window.size, allowed_lateness=s.window.allowed_lateness,
                      max_future_ms=s.limits.max_future, arrival_ms=r.arrival_ms, reserve=s.window.reserve,
                      rebalance=tuple(b.rebalance), rebalance_config=s.rebalance_config(on=True))
    out = run_bench(cfg, r.report, progress=s.log.progress)
    if b.plot:
        for path in plot_report(out["rows"], b.plot):
            print(f"plot: {path}")
    print(f"{'algorithm':10s} {'rebal':>5s} {'W':>3s} {'k_max':>5s} {'queries':>9s} {'sim ms':>8s} {'sim p99':>8s} "
          f"{'wall ms':>8s} {'imbal ms':>8s} {'obj/s':>8s} {'deliv':>6s} {'rho':>5s} exact")
    for r in out["rows"]:
        print(f"{r['algorithm']:10s} {'on' if r['rebalance'] else 'off':>5s} {r['workers']:3d} {r['kmax']:5d} "
              f"{r['queries']:9,d} {r['update_ms_sim_mean']:8.1f} {r['update_ms_sim_p99']:8.1f} "
              f"{_num(r['update_ms_wall_mean'], '8.1f')} {r['imbalance_ms_mean']:8.1f} "
              f"{_num(r['objects_per_s'], '8,.0f')} "
              f"{r['deliveries_per_object']:6.2f} {_num(r['spearman_predicted_vs_busy'], '5.2f')} {r['exact']}")
    if r.report:
        print(f"report: {r.report}")
    return 130 if out["interrupted"] else 0


def add_bench_command(sub: Any) -> None:
    """Register ``bench`` on a root parser's subparsers: its sweep's flags; each run's settings
    are ``[run]`` and the shared sections, the sweep's ``[bench]`` (``knnmon config``)."""
    b = add_verb(sub, "bench", "reproduce the paper's experiments: plan and run every combination, report")
    setting_flag(b, "--objects", "run.objects", metavar="DIR")
    setting_flag(b, "--queries", "bench.queries", metavar="N[,N...]")
    setting_flag(b, "--kmax", "bench.kmax", metavar="K[,K...]")
    setting_flag(b, "--workers", "bench.workers", metavar="W[,W...]")
    setting_flag(b, "--algorithms", "bench.algorithms", metavar="A[,A...]",
                 help=f"of {', '.join((*ALGORITHMS, REFERENCE, IDEAL))} ({REFERENCE}: one process, keyword lists, "
                      f"no assignment; {IDEAL}: the bound, every query on one worker, its work shared evenly)")
    setting_flag(b, "--batches", "run.batches", metavar="M")
    setting_flag(b, "--repeat", "bench.repeat", metavar="R")
    setting_flag(b, "--check", "bench.check", switch=True)
    setting_flag(b, "--report", "run.report", metavar="FILE.json")
    setting_flag(b, "--plot", "bench.plot", metavar="DIR")
    add_config_options(b)
    b.set_defaults(func=_bench)
