"""The bench's ``ideal`` row: the bound no assignment of the queries to ``W`` workers can beat
on this worker (issue 37), measured, beside the plans it bounds.

An assignment decides only two things: how many workers each object is delivered to, and how
evenly the work is spread (docs/benchmarks.md, "Why the speed-up is bounded"). Every candidate
pair and every result change is work exactly one worker does, whatever the plan. The ideal is
the run in which each object reaches one worker, and only if some query needs it, and the work
is perfectly balanced. It is measured, not modelled: the bench runs the same stream with every
query on **one** Ray worker (the routing table then delivers each object at most once, to the
worker holding the queries that share its keywords and cover its cell), and for each ``W``
shares that worker's busy time per batch evenly among ``W`` workers, each of which still pays
the per-batch fixed cost::

    busy_ideal(b, W) = fixed + (busy_1(b) - fixed) / W
    sim_ideal(b, W) = route_cpu_1(b) + max(0, least mean route_cpu of the plans at W - mean route_cpu_1)
                      + busy_ideal(b, W)

with ``fixed`` a worker's busy time per batch that no object causes, fitted by least squares
over every (worker, batch) of the plans' runs at the same ``W`` (:func:`fixed_ms_fit`: busy time
on objects delivered, candidates and changed results, with an intercept); without such runs,
the measured cost model's :data:`FIXED_MS` (docs/benchmarks.md, "Where a worker's time goes").
The fixed cost is what makes more workers cost more in all (docs/benchmarks.md, "The ideal").
Its row carries the bench's columns, ``update_ms_sim_mean`` the bound, ``fixed_ms`` the fixed cost
used; the columns it cannot have (wall time, throughput: no ``W``-worker run happened) are
``None``, ``exact`` is the one-worker run's, and ``ideal_from`` says which run it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FIXED_MS", "IDEAL", "fixed_ms_fit", "ideal_row"]

#: The algorithm name of the bound in ``--algorithms`` and in report rows.
IDEAL = "ideal"
#: A worker's busy time per batch that no query causes (ms): the measured cost model's per-batch
#: term (docs/benchmarks.md, "Where a worker's time goes").
FIXED_MS = 1.25

#: Columns of the one-worker run that a ``W``-worker ideal cannot have measured.
_NOT_MEASURED = ("update_ms_wall_mean", "update_ms_wall_p50", "update_ms_wall_p99", "objects_per_s",
                 "spearman_predicted_vs_busy", "worker_peak_rss_mb", "predicted_worker_loads")


def fixed_ms_fit(rows: Sequence[dict[str, Any]]) -> float | None:
    """The intercept (ms) of ``busy = fixed + a * objects + b * candidates + c * changed`` fitted
    over every (worker, batch) of ``rows`` (bench rows with ``busy_ms_per_batch`` and
    ``per_worker_per_batch``), clipped at 0; ``None`` with fewer than 8 samples."""
    busy, counts = [], []
    for r in rows:
        for b, (objects, candidates, changed) in zip(r["busy_ms_per_batch"], r["per_worker_per_batch"]):
            busy.extend(b)
            counts.extend(zip(objects, candidates, changed))
    if len(busy) < 8:
        return None
    x = np.column_stack([np.ones(len(busy)), np.asarray(counts, dtype=np.float64)])
    coef, *_ = np.linalg.lstsq(x, np.asarray(busy, dtype=np.float64), rcond=None)
    return max(float(coef[0]), 0.0)


def ideal_row(one: dict[str, Any], workers: int, route_cpu_ms: Sequence[float], fixed_ms: float = FIXED_MS,
              route_floor_ms: float = 0.0) -> dict[str, Any]:
    """The ideal row for ``workers`` workers (module docstring) from ``one``, the bench row of
    the same stream with every query on one worker, and that run's routing CPU time per batch
    ``route_cpu_ms`` ``(b,)`` ms, raised by ``route_floor_ms`` less its mean when that is more:
    routing to ``W`` workers costs a call to each per batch, which the one-worker run did not pay
    (the bench passes the least mean routing time of the plans' runs at ``W``).

    Raises
    ------
    ValueError
        ``one`` is not a one-worker row, or ``route_cpu_ms`` is not one value per batch.
    """
    busy1 = np.asarray(one["busy_ms_per_batch"], dtype=np.float64).reshape(-1)
    route = np.asarray(route_cpu_ms, dtype=np.float64)
    if one["workers"] != 1 or len(route) != len(busy1):
        raise ValueError(f"an ideal row needs a one-worker run with its routing time per batch; got "
                         f"{one['workers']} workers, {len(busy1)} batches, {len(route)} routing times")
    share = fixed_ms + np.maximum(busy1 - fixed_ms, 0.0) / workers  # (b,) ms, every worker alike
    route = route + max(route_floor_ms - float(route.mean()), 0.0) if len(route) else route
    sim = route + share
    row = {**one, **dict.fromkeys(_NOT_MEASURED)}
    row.update(algorithm=IDEAL, workers=workers, ideal_from={"workers": 1, "batches": len(busy1)}, fixed_ms=fixed_ms,
               route_cpu_ms_per_batch=route.tolist(), route_cpu_ms_mean=float(route.mean()) if len(route) else 0.0,
               busy_ms_per_batch=[[float(x)] * workers for x in share],
               busy_ms_per_worker=[float(share.sum())] * workers,
               update_ms_sim_mean=float(sim.mean()) if len(sim) else 0.0,
               update_ms_sim_p99=float(np.percentile(sim, 99)) if len(sim) else 0.0,
               imbalance_ms_mean=0.0, slowest_over_mean_busy=1.0, replans=0, queries_moved=0,
               replan_records=[], rebalance=False)
    return row
