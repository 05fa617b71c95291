"""The bench runner: the paper's experiments (Tsuruoka et al. 2019, §5) on the real runtime (``knnmon bench``).

For each combination of query count, ``k_max``, worker count and algorithm, plan, run the stream
on Ray workers with Redis writes, and record per batch the update time and load imbalance:

- **wall** update time: dispatch to all workers done (ms), as measured on this machine;
- **simulated parallel** update time: the coordinator's routing time plus the slowest worker's
  busy time (one core per worker, as the paper ran it; this machine has fewer cores than
  workers);
- **load imbalance**: busiest minus idlest worker busy time per batch (ms);
- **model check**: Spearman correlation between each worker's predicted load (the plan's load
  model, ``docs/concepts.md``) and its measured busy time over the run.

Queries and the initial kNN are computed once per (query count, ``k_max``) and shared by every
run (:func:`knnmon.coordinator.runtime.preparation.prepare`). The **single-process reference**
(``single``) is one in-process worker with keyword inverted lists and no assignment
(:class:`~knnmon.workers.keyword_lists.KeywordLists`), on the same stream, writing the same
Redis results. Each row also records :func:`~knnmon.coordinator.bench.speed_probe.speed_probe_ms`
before and after its run (``speed_probe_ms``), and ``machine`` the value at the start: rows
measured while the shared machine ran slower show it. The report is rewritten after every run,
so an interrupted bench (Ctrl-C) keeps what it measured, including the batches of the
interrupted run; SIGTERM is handled the same way.
"""

from __future__ import annotations

import contextlib
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
from knnmon.costs import CostModel
from knnmon.coordinator.bench.ideal import IDEAL, ideal_row
from knnmon.coordinator.bench.oracle_check import mismatches
from knnmon.coordinator.bench.speed_probe import speed_probe_ms
from knnmon.coordinator.rebalance.rebalancer import Rebalancer
from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.recovery.reviver import Reviver
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.runtime.metrics import RunSummary
from knnmon.coordinator.runtime.preparation import Prepared, live_initial, prepare
from knnmon.coordinator.runtime.ray_start import init_ray, shutdown_ray
from knnmon.connection import redact
from knnmon.errors import InputPathError, InvalidArgumentError
from knnmon.keys import BENCH_NAMESPACE
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.ingest.queries import QueryWorkload, generate_queries
from knnmon.ingest.reading import OBJECT_COLUMNS, read_objects
from knnmon.store import StoreConfig, open_store

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
    workers: tuple[int, ...] = (RunConfig.workers,)
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
    namespace: str = BENCH_NAMESPACE
    ray_address: str | None = None
    window: int | None = None
    allowed_lateness: int = 0
    max_future_ms: int | None = DEFAULT_LIMITS.max_future_ms
    arrival_ms: int | None = None
    reserve: int | None = None
    rebalance: tuple[bool, ...] = (False,)
    rebalance_config: RebalanceConfig = field(default_factory=RebalanceConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        valid = (*ALGORITHMS, REFERENCE, IDEAL)
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
            raise InvalidArgumentError(f"bench.check_sample must be >= 1; got {self.check_sample}")
        RunConfig(workers=1, initial=self.initial, batch=self.batch, batches=self.batches, window=self.window,
                  allowed_lateness=self.allowed_lateness, arrival_ms=self.arrival_ms)  # same checks
        if not os.path.isfile(os.path.join(self.objects, "manifest.json")):
            raise InputPathError(f"{self.objects} is not an ingest output (no manifest.json): "
                                 f"run `knnmon ingest ... --out {self.objects}` first")

    @property
    def limits(self) -> Limits:
        """The bounds on input: only ``--max-future`` is a bench flag."""
        return Limits(max_future_ms=self.max_future_ms)


def machine_info() -> dict[str, Any]:
    """The machine and versions a report was measured on."""
    import ray
    import redis

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    from knnmon.redis_server import server_version

    redis_server = server_version()  # the embedded default's
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


def _row(rt: Runtime, summary: RunSummary, algorithm: str, kmax: int, repeat: int) -> dict[str, Any]:
    s = summary
    total = np.array(s.busy_ms_per_worker or [0.0] * rt.config.workers)
    predicted = s.predicted_worker_loads
    return {
        "algorithm": algorithm, "rebalance": s.rebalance, "replans": len(s.replans),
        "queries_moved": s.queries_moved, "replan_records": [asdict(r) for r in s.replans],
        "workers": rt.config.workers, "kmax": kmax,
        "queries": s.queries,
        "repeat": repeat, "batches": s.batches, "objects": s.objects,
        "update_ms_wall_mean": s.update_ms_mean, "update_ms_wall_p50": s.update_ms_p50,
        "update_ms_wall_p99": s.update_ms_p99, "update_ms_sim_mean": s.update_ms_sim_mean,
        "update_ms_sim_p99": s.update_ms_sim_p99, "imbalance_ms_mean": s.imbalance_ms_mean,
        "slowest_over_mean_busy": s.slowest_over_mean_busy,
        "busy_ms_per_batch": [r.busy_ms for r in rt.reports],
        "index_ms_per_batch": [r.index_ms for r in rt.reports],
        "redis_server_ms_per_batch": [r.redis_server_ms for r in rt.reports],
        "compactions_per_batch": [[r.index_merges, r.handle_compactions] for r in rt.reports],
        "objects_per_s": s.objects_per_s, "deliveries_per_object": s.deliveries_per_object,
        "results_changed": s.results_changed, "candidates_per_change": s.candidates_per_change,
        "late_ignored": s.late_ignored, "results_refilled": s.results_refilled, "refill_ms_mean": s.refill_ms_mean,
        "refill_ms_per_result": s.refill_ms_per_result,
        "route_cpu_ms_mean": s.route_cpu_ms_mean, "route_cpu_ms_per_batch": [r.route_cpu_ms for r in rt.reports],
        "per_worker_per_batch": [r.per_worker for r in rt.reports],
        "busy_ms_per_worker": total.tolist(),
        "per_worker_totals": s.per_worker_totals, "predicted_worker_loads": predicted,
        "spearman_predicted_vs_busy": spearman(predicted, total) if algorithm not in (REFERENCE, IDEAL) else None,
        "worker_peak_rss_mb": [round(w.peak_rss_mb, 1) for w in s.workers_stats],
        "startup_s": s.startup_s, "exact": None, "mismatched_queries": None, "checked_queries": None,
        "routing": {k: v for k, v in rt.plan.summary.items() if k.startswith("routing")},
    }


def _one_run(cfg: BenchConfig, prepared: Prepared, all_objects: pa.Table | None, algorithm: str, workers: int,
             kmax: int, repeat: int, redis_url: str, progress: bool, rebalance: bool = False) -> dict[str, Any]:
    reference = algorithm == REFERENCE
    one = reference or algorithm == IDEAL  # (the ideal's run: every query on one Ray worker, ideal.py)
    config = RunConfig(workers=1 if one else workers, algorithm="random" if one else algorithm,
                       initial=cfg.initial, batch=cfg.batch, batches=cfg.batches, shuffle=cfg.shuffle,
                       window=cfg.window, allowed_lateness=cfg.allowed_lateness, limits=cfg.limits,
                       arrival_ms=cfg.arrival_ms, reserve=cfg.reserve, cost_model=cfg.cost_model,
                       store=StoreConfig(url=redis_url, namespace=cfg.namespace),
                       executor="inline" if reference else "ray",
                       index="keyword-lists" if reference else "grid", seed=cfg.seed,
                       rebalance=cfg.rebalance_config if rebalance and not one else None,
                       **{"in_flight": 1, **cfg.extra})  # the paper's update time: one batch at a time
    rt = Runtime(cfg.objects, prepared.queries, config, prepared=prepared, rebalancer=Rebalancer, reviver=Reviver)
    probe_before = speed_probe_ms()
    try:
        rt.start()
        interrupted = False
        try:
            summary = rt.run(progress=progress)
        except KeyboardInterrupt:
            interrupted = True
            summary = rt.summary()
        row = _row(rt, summary, algorithm, kmax, repeat)
        row["interrupted"] = interrupted
        row["speed_probe_ms"] = [round(probe_before, 1), round(speed_probe_ms(), 1)]
        if cfg.check and not interrupted and all_objects is not None:
            checked = _check_sample(prepared.queries, cfg.check_sample, cfg.seed)
            bad = mismatches(redis_url, cfg.namespace, checked, all_objects)
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
    objects = read_objects(cfg.objects, OBJECT_COLUMNS)
    if max(cfg.queries) > objects.num_rows:
        raise InvalidArgumentError(f"--queries {max(cfg.queries)} exceeds the {objects.num_rows:,} objects that "
                                   f"can seed them (one object per query)")
    out: dict[str, Any] = {"machine": machine_info(), "config": {**asdict(cfg), "redis_url": redact(cfg.redis_url)},
                           "rows": [], "interrupted": False}

    def save() -> None:
        if report:
            with open(report, "w") as f:
                json.dump(out, f, indent=1)

    ray_started = False
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    stack = contextlib.ExitStack()
    try:
        redis_url = stack.enter_context(open_store(StoreConfig(url=cfg.redis_url, namespace=cfg.namespace,
                                                               data_dir=None))).url  # not saved
        ray_started = init_ray(cfg.ray_address)
        for n in cfg.queries:
            for kmax in cfg.kmax:
                queries = generate_queries(objects, QueryWorkload(n=n, k_max=kmax, seed=cfg.seed))
                base = RunConfig(initial=cfg.initial, batch=cfg.batch, batches=cfg.batches, shuffle=cfg.shuffle,
                                 window=cfg.window, allowed_lateness=cfg.allowed_lateness, limits=cfg.limits,
                                 arrival_ms=cfg.arrival_ms, reserve=cfg.reserve)
                prepared = prepare(cfg.objects, queries, base)
                streamed = pa.concat_tables([prepared.initial, prepared.stream]) if cfg.check else None
                if streamed is not None and cfg.window is not None:  # the oracle sees the live objects
                    streamed = live_initial(streamed, cfg.window, cfg.allowed_lateness)
                combos = [(a, w, rb) for w in cfg.workers for a in cfg.algorithms if a not in (REFERENCE, IDEAL)
                          for rb in cfg.rebalance]
                combos += [(a, 1, False) for a in (IDEAL, REFERENCE) if a in cfg.algorithms]
                for algorithm, w, rb in combos:
                    for rep in range(cfg.repeat):
                        log(f"bench: {algorithm} W={w} k_max={kmax} queries={n:,} rebalance={'on' if rb else 'off'} "
                            f"(repeat {rep + 1}/{cfg.repeat})")
                        row = _one_run(cfg, prepared, streamed, algorithm, w, kmax, rep, redis_url, progress, rb)
                        log(f"  sim update {row['update_ms_sim_mean']:.1f} ms, wall {row['update_ms_wall_mean']:.1f}"
                            f" ms, imbalance {row['imbalance_ms_mean']:.1f} ms, {row['objects_per_s']:,.0f} obj/s"
                            + (f", exact={row['exact']}" if row["exact"] is not None else ""))
                        if algorithm == IDEAL:  # the bound at every W, from the one-worker run
                            rows = [ideal_row(row, v, _plans_at(out["rows"], n, kmax, v)) for v in cfg.workers]
                            log("  ideal: sim update " + ", ".join(f"W={r['workers']} {r['update_ms_sim_mean']:.1f} ms"
                                                                   for r in rows))
                        out["rows"].extend(rows if algorithm == IDEAL else [row])
                        save()
    except (KeyboardInterrupt, _Interrupted) as ex:
        if isinstance(ex, _Interrupted):
            out["rows"].append(ex.row)
        out["interrupted"] = True
        log("bench: interrupted; the report keeps what was measured")
    finally:
        save()
        stack.close()
        if ray_started:
            shutdown_ray()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _plans_at(rows: list[dict[str, Any]], queries: int, kmax: int, workers: int) -> list[dict[str, Any]]:
    """The plans' rows (not the reference's or the ideal's) of ``queries``, ``kmax`` and
    ``workers``, that ran to the end: what the ideal is priced from
    (:func:`~knnmon.coordinator.bench.ideal.ideal_row`)."""
    return [r for r in rows if (r["queries"], r["kmax"], r["workers"]) == (queries, kmax, workers)
            and r["algorithm"] not in (REFERENCE, IDEAL) and not r.get("interrupted")]


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops a bench like Ctrl-C: the report keeps what was measured."""
    raise KeyboardInterrupt
