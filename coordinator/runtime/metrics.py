"""What a run measures: one :class:`BatchReport` per batch, one :class:`RunSummary` per run.

- **update time**: dispatch of a batch to all its workers done, with its writes in Redis (ms);
- each worker's **busy time**: its CPU time plus the Redis server's time on its writes, the time
  it would take on a core of its own (:class:`~knnmon.reports.WorkerReport`);
- **load imbalance**: busiest minus idlest worker's busy time (ms);
- **simulated parallel update time**: the coordinator's routing CPU time plus the largest busy
  time (one core per worker, as Tsuruoka et al. 2019, §5, ran it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from knnmon.connection import redact
from knnmon.coordinator.runtime.rebalance_config import Replan
from knnmon.reports import WorkerReport, WorkerStats

__all__ = ["BatchReport", "RunSummary", "summarize_run"]


@dataclass(frozen=True)
class BatchReport:
    """One batch, measured (module docstring).

    Attributes
    ----------
    batch, objects, duplicates : int
        Batch number; objects streamed; repeated ids dropped.
    update_ms, route_ms, route_cpu_ms : float
        Update time; the coordinator's wall and CPU time routing (ms).
    busy_ms, busy_wall_ms : list of float, ``(W,)``
        Per worker: busy time on a dedicated core; wall time from call to return (ms).
    index_ms : list of float, ``(W,)``
        Per worker: of ``busy_wall_ms``, the time re-indexing shrunk queries and compacting the
        query index and the object handles (ms).
    index_merges, handle_compactions : list of int, ``(W,)``
        Per worker: its query index's full merges and its handles' compactions in the batch.
    imbalance_ms, sim_update_ms : float
        Of ``busy_ms``; ``route_cpu_ms + max(busy_ms)``.
    per_worker : list of 3 lists ``(W,)``
        Objects delivered, candidates, results changed, per worker.
    deliveries, candidates, passed, changed : int
        Totals over workers (deliveries: (object, worker) pairs sent).
    redis_server_ms : float
        The Redis server's time running the workers' result scripts, summed: Redis is
        single-threaded, so this much of the batch is serial.
    late, refilled : int
        With a window: objects that arrived expired (not applied); results refilled.
    refill_ms : float
        With a window: the coordinator's time expiring and searching the refills (ms).
    """

    batch: int
    objects: int
    duplicates: int
    update_ms: float
    route_ms: float
    route_cpu_ms: float
    busy_ms: list[float]
    busy_wall_ms: list[float]
    imbalance_ms: float
    sim_update_ms: float
    per_worker: list[list[float]]
    deliveries: int
    candidates: int
    passed: int
    changed: int
    redis_server_ms: float
    late: int = 0
    refilled: int = 0
    refill_ms: float = 0.0
    index_ms: list[float] = field(default_factory=list)
    index_merges: list[int] = field(default_factory=list)
    handle_compactions: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, batch: int, objects: int, duplicates: int, deliveries: int, workers: int, update_ms: float,
           route_ms: float, route_cpu_ms: float, reports: Sequence[WorkerReport], *, late: int = 0,
           refill_ms: float = 0.0) -> BatchReport:
        """A batch's figures from its workers' reports (workers sent nothing count as idle)."""
        busy, busy_wall, index = np.zeros(workers), np.zeros(workers), np.zeros(workers)
        merges, handles = [0] * workers, [0] * workers
        per_worker = np.zeros((3, workers))
        for r in reports:
            busy[r.worker] = r.cpu_s * 1e3
            busy_wall[r.worker] = r.busy_s * 1e3
            index[r.worker] = r.index_s * 1e3
            merges[r.worker], handles[r.worker] = r.index_merges, r.handle_compactions
            per_worker[:, r.worker] = (r.objects, r.candidates, r.changed)
        return cls(batch=batch, objects=objects, duplicates=duplicates, update_ms=update_ms, route_ms=route_ms,
                   route_cpu_ms=route_cpu_ms, busy_ms=busy.tolist(), busy_wall_ms=busy_wall.tolist(),
                   imbalance_ms=float(busy.max() - busy.min()), sim_update_ms=route_cpu_ms + float(busy.max()),
                   per_worker=per_worker.tolist(), deliveries=deliveries,
                   candidates=sum(r.candidates for r in reports), passed=sum(r.passed for r in reports),
                   changed=sum(r.changed for r in reports),
                   redis_server_ms=sum(r.redis_server_s for r in reports) * 1e3, late=late,
                   refilled=sum(r.refilled for r in reports), refill_ms=refill_ms,
                   index_ms=index.tolist(),
                   index_merges=merges, handle_compactions=handles)


@dataclass(frozen=True)
class RunSummary:
    """A run's figures (``knnmon run`` prints them, ``--report`` writes :meth:`to_dict`).

    Times in ms unless named ``_s``; ``update_ms_*`` over batches (mean, p50, p99, max),
    ``update_ms_sim_*`` the simulated parallel update time, ``objects_per_s`` end to end,
    ``busy_ms_per_worker`` ``(W,)`` summed over batches, ``per_worker_totals`` objects,
    candidates and changes per worker, ``predicted_worker_loads`` the plan's, ``startup_s``
    seconds per start-up step, ``workers_revived`` lost workers brought back, ``workers_stats`` each worker's
    :meth:`~knnmon.workers.worker.KnnWorker.stats`, ``results_store`` where the results are;
    with a window, ``late_ignored`` objects that arrived expired, ``results_refilled`` and the
    coordinator's ``refill_ms_mean`` per batch and ``refill_ms_per_result`` (expiry and search);
    ``slowest_over_mean_busy`` of ``busy_ms_per_worker``; with re-balancing (``rebalance``),
    every re-plan's record (``replans``) and ``queries_moved`` in all.
    """

    config: dict[str, Any]
    queries: int
    workers: int
    algorithm: str
    initial_objects: int
    batches: int
    objects: int
    duplicates_ignored: int
    wall_s: float
    objects_per_s: float
    update_ms_mean: float
    update_ms_p50: float
    update_ms_p99: float
    update_ms_max: float
    update_ms_sim_mean: float
    update_ms_sim_p99: float
    imbalance_ms_mean: float
    deliveries_per_object: float
    results_changed: int
    candidates: int
    pairs_within_radius: int
    candidates_per_change: float | None
    busy_ms_per_worker: list[float]
    route_cpu_ms_mean: float
    redis_server_ms_mean: float
    redis_server_ms_p99: float
    per_worker_totals: dict[str, list[int]]
    predicted_worker_loads: list[float]
    startup_s: dict[str, float]
    results_store: str
    workers_revived: int = 0
    workers_stats: list[WorkerStats] = field(default_factory=list)
    late_ignored: int = 0
    results_refilled: int = 0
    refill_ms_mean: float = 0.0
    refill_ms_per_result: float | None = None
    rebalance: bool = False
    replans: list[Replan] = field(default_factory=list)
    queries_moved: int = 0
    slowest_over_mean_busy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON-able values."""
        return asdict(self)


def summarize_run(rows: Sequence[BatchReport], wall_s: float, *, config: Any, queries: int, initial_objects: int,
                  predicted_worker_loads: list[float], startup_s: dict[str, float], results_store: str,
                  workers_revived: int = 0, workers_stats: list[WorkerStats] | None = None,
                  replans: list[Replan] | None = None) -> RunSummary:
    """The :class:`RunSummary` of a run's batches (``config``: its
    :class:`~knnmon.coordinator.runtime.config.RunConfig`)."""
    one = np.zeros(1)
    upd = np.array([r.update_ms for r in rows]) if rows else one
    sim = np.array([r.sim_update_ms for r in rows]) if rows else one
    redis_ms = np.array([r.redis_server_ms for r in rows]) if rows else one
    objects = sum(r.objects for r in rows)
    changed = sum(r.changed for r in rows)
    cand = sum(r.candidates for r in rows)
    busy = np.sum([r.busy_ms for r in rows], axis=0) if rows else np.zeros(0)
    settings = asdict(config)
    settings["store"]["url"] = redact(settings["store"]["url"])
    return RunSummary(
        config=settings, queries=queries, workers=config.workers, algorithm=config.algorithm,
        initial_objects=initial_objects, batches=len(rows), objects=objects,
        duplicates_ignored=sum(r.duplicates for r in rows), wall_s=round(wall_s, 3),
        objects_per_s=objects / wall_s if wall_s > 0 else 0.0,
        update_ms_mean=float(upd.mean()), update_ms_p50=float(np.percentile(upd, 50)),
        update_ms_p99=float(np.percentile(upd, 99)), update_ms_max=float(upd.max()),
        update_ms_sim_mean=float(sim.mean()), update_ms_sim_p99=float(np.percentile(sim, 99)),
        imbalance_ms_mean=float(np.mean([r.imbalance_ms for r in rows])) if rows else 0.0,
        deliveries_per_object=sum(r.deliveries for r in rows) / objects if objects else 0.0,
        results_changed=changed, candidates=cand, pairs_within_radius=sum(r.passed for r in rows),
        candidates_per_change=cand / changed if changed else None,
        busy_ms_per_worker=busy.round(1).tolist(),
        route_cpu_ms_mean=float(np.mean([r.route_cpu_ms for r in rows])) if rows else 0.0,
        redis_server_ms_mean=float(redis_ms.mean()), redis_server_ms_p99=float(np.percentile(redis_ms, 99)),
        per_worker_totals=dict(zip(("objects", "candidates", "changed"),
                                   np.sum([r.per_worker for r in rows], axis=0).astype(int).tolist())) if rows else {},
        predicted_worker_loads=list(predicted_worker_loads), startup_s={k: round(v, 3) for k, v in startup_s.items()},
        results_store=results_store, workers_revived=workers_revived, workers_stats=list(workers_stats or []),
        late_ignored=sum(r.late for r in rows), results_refilled=sum(r.refilled for r in rows),
        refill_ms_mean=float(np.mean([r.refill_ms for r in rows])) if rows else 0.0,
        refill_ms_per_result=(sum(r.refill_ms for r in rows) / sum(r.refilled for r in rows)
                              if sum(r.refilled for r in rows) else None),
        rebalance=getattr(config, "rebalance", None) is not None, replans=list(replans or []),
        queries_moved=sum(r.queries_moved for r in replans or []),
        slowest_over_mean_busy=float(busy.max() / busy.mean()) if len(busy) and busy.mean() > 0 else None)
