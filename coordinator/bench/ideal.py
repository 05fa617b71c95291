"""The bench's ``ideal`` row: the bound no assignment of the queries to ``W`` workers can beat
on this worker (issue 37), beside the plans it bounds.

An assignment decides only two things: how many workers each object is delivered to, and how
evenly the work is spread (docs/benchmarks.md, "Why the speed-up is bounded"). Every candidate
pair and every result change is work exactly one worker does, whatever the plan. The ideal is
the run in which each object reaches one worker, and only if some query needs it, and the work
is perfectly balanced. Its work is counted and priced from measurements of the same sitting:

- **counted** by a run of the same stream with every query on one Ray worker: per batch, the
  objects delivered to it (each at most once: those sharing a keyword with a query whose region
  holds their cell), its candidate pairs and its changed results;
- **priced** by the costs fitted over every (worker, batch) of the plans' runs at the same
  ``W`` (:func:`cost_fit`: busy time on a fixed cost per batch, objects delivered, candidates and
  changed results, least squares, no negative cost), shared evenly by the ``W`` workers, each
  paying the fixed cost::

    busy_ideal(b, W) = fixed + (per_object * objects_1(b) + per_candidate * candidates_1(b)
                                + per_change * changed_1(b)) / W
    sim_ideal(b, W) = route_cpu_1(b) - mean(route_cpu_1) + least mean route_cpu of the plans at W
                      + busy_ideal(b, W)

The one-worker run's own busy time is not the ideal's: a worker holding every query is slower
per unit of work than ``W`` workers holding a share each (its per-batch passes run over all the
queries), so its time shared by ``W`` bounds nothing (docs/benchmarks.md, "The ideal"). Without
plans' runs at ``W`` the row falls back to it, with the cost model's :data:`~knnmon.costs.FIXED_MS`.
Its row carries the bench's columns, ``update_ms_sim_mean`` the bound, ``costs`` the prices
used; the columns it cannot have (wall time, throughput: no ``W``-worker run happened) are
``None``, ``exact`` is the one-worker run's, and ``ideal_from`` says which run it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from knnmon.costs import FIXED_MS

__all__ = ["IDEAL", "cost_fit", "ideal_row"]

#: The algorithm name of the bound in ``--algorithms`` and in report rows.
IDEAL = "ideal"

#: Columns of the one-worker run that a ``W``-worker ideal cannot have measured.
_NOT_MEASURED = ("update_ms_wall_mean", "update_ms_wall_p50", "update_ms_wall_p99", "objects_per_s",
                 "spearman_predicted_vs_busy", "worker_peak_rss_mb", "predicted_worker_loads")


def cost_fit(rows: Sequence[dict[str, Any]]) -> np.ndarray | None:
    """``(4,)`` float64: a worker's fixed busy time per batch (ms) and its ms per object
    delivered, per candidate pair and per changed result, fitted by least squares over every
    (worker, batch) of ``rows`` (bench rows with ``busy_ms_per_batch`` and
    ``per_worker_per_batch``); a cost that comes out negative is dropped and the rest refitted,
    a negative fixed cost clipped to 0. ``None`` with fewer than 8 samples."""
    busy, counts = [], []
    for r in rows:
        for b, (objects, candidates, changed) in zip(r["busy_ms_per_batch"], r["per_worker_per_batch"]):
            busy.extend(b)
            counts.extend(zip(objects, candidates, changed))
    if len(busy) < 8:
        return None
    x = np.column_stack([np.ones(len(busy)), np.asarray(counts, dtype=np.float64)])
    y = np.asarray(busy, dtype=np.float64)
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        negative = [k for k, c in zip(keep[1:], coef[1:]) if c < 0]
        if not negative:
            break
        keep.remove(min(negative, key=lambda k: coef[keep.index(k)]))
    out = np.zeros(4)
    out[keep] = coef
    out[0] = max(out[0], 0.0)
    return out


def ideal_row(one: dict[str, Any], workers: int, plans: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The ideal row for ``workers`` workers (module docstring) from ``one``, the bench row of
    the same stream with every query on one worker (its ``per_worker_per_batch`` counts and
    ``route_cpu_ms_per_batch``), priced from ``plans``: the rows of the plans' runs of the same
    stream at ``workers`` (:func:`cost_fit`; their least mean routing time is the ideal's:
    routing to ``W`` workers costs a call to each per batch, which the one-worker run did not
    pay, and does not depend on the plan otherwise). Without ``plans``: ``one``'s busy time
    shared, with :data:`~knnmon.costs.FIXED_MS`, and its routing.

    Raises
    ------
    ValueError
        ``one`` is not a one-worker row, or its routing times are not one per batch.
    """
    costs = cost_fit(plans)
    route_floor_ms = min((r["route_cpu_ms_mean"] for r in plans), default=0.0)
    busy1 = np.asarray(one["busy_ms_per_batch"], dtype=np.float64).reshape(-1)
    route = np.asarray(one["route_cpu_ms_per_batch"], dtype=np.float64)
    if one["workers"] != 1 or len(route) != len(busy1):
        raise ValueError(f"an ideal row needs a one-worker run with its routing time per batch; got "
                         f"{one['workers']} workers, {len(busy1)} batches, {len(route)} routing times")
    if costs is None:
        fixed_ms = FIXED_MS
        share = fixed_ms + np.maximum(busy1 - fixed_ms, 0.0) / workers  # (b,) ms, every worker alike
    else:
        work = np.asarray([[w[0] for w in batch] for batch in one["per_worker_per_batch"]], dtype=np.float64)
        fixed_ms = float(costs[0])
        share = fixed_ms + work @ np.asarray(costs[1:], dtype=np.float64) / workers
    if route_floor_ms > 0 and len(route):  # (the plans' least mean, the one-worker run's batch to batch shape)
        route = route - float(route.mean()) + route_floor_ms
    sim = route + share
    row = {**one, **dict.fromkeys(_NOT_MEASURED)}
    row.update(algorithm=IDEAL, workers=workers, ideal_from={"workers": 1, "batches": len(busy1)}, fixed_ms=fixed_ms,
               costs=None if costs is None else [round(float(c), 9) for c in costs],
               route_cpu_ms_per_batch=route.tolist(), route_cpu_ms_mean=float(route.mean()) if len(route) else 0.0,
               busy_ms_per_batch=[[float(x)] * workers for x in share],
               busy_ms_per_worker=[float(share.sum())] * workers,
               update_ms_sim_mean=float(sim.mean()) if len(sim) else 0.0,
               update_ms_sim_p99=float(np.percentile(sim, 99)) if len(sim) else 0.0,
               imbalance_ms_mean=0.0, slowest_over_mean_busy=1.0, replans=0, queries_moved=0,
               replan_records=[], rebalance=False)
    return row
