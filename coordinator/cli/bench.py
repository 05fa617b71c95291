"""``knnmon bench``: the paper's experiments on the real runtime (:mod:`knnmon.coordinator.bench`)."""

from __future__ import annotations

from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.coordinator.bench.ideal import IDEAL
from knnmon.coordinator.bench.runner import BENCH_NAMESPACE, REFERENCE
from knnmon.coordinator.cli.options import (add_verb, DEFAULT_WORKERS, add_batch_option, add_cost_model_option,
                                            add_rebalance_options, add_store_options, add_window_options,
                                            rebalance_config)
from knnmon.errors import InvalidArgumentError

__all__ = ["add_bench_command"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidArgumentError(f"expected comma-separated integers; got {text!r}") from None


def _switches(text: str) -> tuple[bool, ...]:
    values = {"off": False, "on": True}
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or any(p not in values for p in parts):
        raise InvalidArgumentError(f"--rebalance takes off, on or off,on; got {text!r}")
    return tuple(values[p] for p in parts)


def _num(value: float | None, fmt: str) -> str:
    """``value`` formatted, or ``-`` right-aligned to the width (a column the row does not have:
    the ideal's wall time and throughput, a Spearman of fewer than 3 workers)."""
    width = int(fmt.split(".")[0].replace(",", "") or 0)
    return f"{'-':>{width}s}" if value is None else format(value, fmt)


def _bench(a: Any) -> int:
    from knnmon.coordinator.bench.plots import plot_report
    from knnmon.coordinator.bench.runner import BenchConfig, run_bench

    cfg = BenchConfig(objects=a.objects, queries=_ints(a.queries), kmax=_ints(a.kmax), workers=_ints(a.workers),
                      algorithms=tuple(x.strip() for x in a.algorithms.split(",") if x.strip()),
                      initial=a.initial, batch=a.batch, batches=a.batches, repeat=a.repeat, shuffle=a.shuffle,
                      cost_model=a.cost_model,
                      check=a.check or a.check_sample is not None, check_sample=a.check_sample,
                      seed=a.seed, redis_url=a.redis, namespace=a.namespace, ray_address=a.ray_address,
                      window=a.window, allowed_lateness=a.allowed_lateness, max_future_ms=a.max_future,
                      arrival_ms=a.arrival_ms, reserve=a.reserve,
                      rebalance=_switches(a.rebalance), rebalance_config=rebalance_config(a, on=True))
    out = run_bench(cfg, a.report, progress=not a.quiet)
    if a.plot:
        for path in plot_report(out["rows"], a.plot):
            print(f"plot: {path}")
    print(f"{'algorithm':10s} {'rebal':>5s} {'W':>3s} {'k_max':>5s} {'queries':>9s} {'sim ms':>8s} {'sim p99':>8s} "
          f"{'wall ms':>8s} {'imbal ms':>8s} {'obj/s':>8s} {'deliv':>6s} {'rho':>5s} exact")
    for r in out["rows"]:
        print(f"{r['algorithm']:10s} {'on' if r['rebalance'] else 'off':>5s} {r['workers']:3d} {r['kmax']:5d} "
              f"{r['queries']:9,d} {r['update_ms_sim_mean']:8.1f} {r['update_ms_sim_p99']:8.1f} "
              f"{_num(r['update_ms_wall_mean'], '8.1f')} {r['imbalance_ms_mean']:8.1f} "
              f"{_num(r['objects_per_s'], '8,.0f')} "
              f"{r['deliveries_per_object']:6.2f} {_num(r['spearman_predicted_vs_busy'], '5.2f')} {r['exact']}")
    if a.report:
        print(f"report: {a.report}")
    return 130 if out["interrupted"] else 0


def add_bench_command(sub: Any) -> None:
    """Register ``bench`` on a root parser's subparsers."""
    b = add_verb(sub, "bench", "reproduce the paper's experiments: plan and run every combination, report")
    b.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    b.add_argument("--queries", required=True, metavar="N[,N...]", help="numbers of queries to draw from the objects")
    b.add_argument("--kmax", default="10", metavar="K[,K...]", help="k of each query uniform in [1, K] (default 10)")
    b.add_argument("--workers", default=str(DEFAULT_WORKERS), metavar="W[,W...]",
                   help=f"worker counts (default {DEFAULT_WORKERS})")
    b.add_argument("--algorithms", default="proposed,keyword,space,random", metavar="A[,A...]",
                   help=f"of {', '.join((*ALGORITHMS, REFERENCE, IDEAL))} ({REFERENCE}: one process, keyword lists, "
                        f"no assignment; {IDEAL}: the bound, every query on one worker, its work shared evenly)")
    b.add_argument("--initial", type=int, default=1_000_000, metavar="N", help="objects seen before the stream")
    add_batch_option(b)
    b.add_argument("--batches", type=int, metavar="M", help="batches per run (default: all objects)")
    b.add_argument("--repeat", type=int, default=1, metavar="R", help="runs per combination (default 1)")
    b.add_argument("--shuffle", type=int, metavar="SEED",
                   help="stream objects in random order (stationary) instead of (t, id)")
    add_cost_model_option(b)
    add_window_options(b)
    b.add_argument("--rebalance", default="off", metavar="off,on",
                   help="re-balancing off, on, or both (a sweep dimension; default off)")
    add_rebalance_options(b, flag=False)
    b.add_argument("--check", action="store_true", help="check every result against the brute-force oracle")
    b.add_argument("--check-sample", type=int, metavar="N",
                   help="check N queries drawn at random (seeded) instead of all (implies --check)")
    b.add_argument("--seed", type=int, default=0, help="query generation and random-assignment seed")
    b.add_argument("--report", metavar="FILE.json", help="write {machine, config, rows} as JSON")
    b.add_argument("--plot", metavar="DIR", help="write PNG plots (update time and imbalance per swept parameter)")
    add_store_options(b, data_dir=False, namespace=BENCH_NAMESPACE)
    b.add_argument("--ray-address", metavar="ADDR", help="join a Ray cluster (default: a local Ray instance)")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_bench)
