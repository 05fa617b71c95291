"""Predicted figures of a plan: worker loads, load imbalance, deliveries per object."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from knnmon.assignment.base import Plan
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.routing import RoutingTable, popcount
from knnmon.assignment.workload import Workload

__all__ = ["worker_deliveries", "summarize"]


def worker_deliveries(routing: RoutingTable, model: LoadModel, workers: int) -> np.ndarray:
    """``D(w)`` of each worker: ``(W,)`` float64, from the routing table.

    The sum of ``P(c, key)`` over every statistics cell and keyword routed to ``w``: the same
    union-of-rectangles definition as ``D(S)`` in :mod:`knnmon.assignment.loadmodel`, for the
    set of all of ``w``'s queries (with the table's pairs held as rectangles or everywhere,
    what the table routes rather than what the queries need), by :meth:`RoutingTable.route_v`.
    """
    K = len(model.keywords)
    code = np.repeat(np.arange(K, dtype=np.int64), np.diff(model.ptr))
    # (each statistics pair routed as an object of its own: every part of the table, as a batch is)
    masks = routing.route_v(model.cells, np.arange(len(code), dtype=np.int64), code)
    p = model.counts / model.n_objects
    return np.array([p[(masks >> np.uint64(w)) & np.uint64(1) == 1].sum() for w in range(workers)])


def summarize(plan: Plan, workload: Workload, model: LoadModel, routing: RoutingTable, *, delivery_cost: float,
              sample: pa.Table | None = None) -> dict[str, Any]:
    """The ``summary.json`` figures of a plan (without ``elapsed_s``).

    Parameters
    ----------
    sample
        Objects (``lon``, ``lat``, ``keywords``) to route for the measured
        ``deliveries_per_object``, e.g. a sample of the initial objects; ``None`` reports the
        model's ``sum_w D(w)`` instead.

    Returns
    -------
    dict
        ``worker_loads`` (list, ``L(w) + lambda * D(w)``), ``worker_work`` (``L(w)``, formula
        (10)), ``worker_deliveries`` (``D(w)``), ``imbalance`` (max / mean of ``worker_loads``),
        ``deliveries_per_object`` (workers an object is routed to, mean over ``sample``),
        ``worker_queries``, ``sets``, ``routing_table_bytes`` and the routing table's
        :attr:`~RoutingTable.stats` (``routing_pairs_promoted`` ...: pairs sent everywhere to keep
        it within ``routing_max_entries``).
    """
    W = plan.workers
    work = np.bincount(plan.worker, weights=workload.load, minlength=W)
    deliveries = worker_deliveries(routing, model, W)
    loads = work + delivery_cost * deliveries
    mean = loads.mean()
    out: dict[str, Any] = {
        "algorithm": plan.algorithm,
        "workers": W,
        "queries": len(workload),
        "worker_loads": loads.round(6).tolist(),
        "worker_work": work.round(6).tolist(),
        "worker_deliveries": deliveries.round(6).tolist(),
        "worker_queries": np.bincount(plan.worker, minlength=W).tolist(),
        "imbalance": float(loads.max() / mean) if mean > 0 else 1.0,
        "max_worker_load": float(loads.max()),
        "sets": len(plan.sets),
        "delivery_cost": delivery_cost,
        "routing_table_bytes": routing.nbytes,
        **routing.stats,
        "params": plan.params,
    }
    if sample is not None and sample.num_rows:
        masks = routing.route_objects(sample.column("lon").to_numpy(), sample.column("lat").to_numpy(),
                                      sample.column("keywords"))
        out["deliveries_per_object"] = float(popcount(masks).mean())
        out["deliveries_measured_on"] = f"{sample.num_rows} sampled initial objects"
    else:
        out["deliveries_per_object"] = float(deliveries.sum())
        out["deliveries_measured_on"] = "load model: sum of D(w) (no initial objects to sample)"
    return out
