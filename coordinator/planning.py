"""Planning: load model + exact kNN radii + an assignment algorithm -> a plan (``knnmon plan``).

Writes ``PLANDIR/summary.json`` (``algorithm``, ``workers``, ``worker_loads``, ``imbalance``,
``deliveries_per_object``, ``sets``, ``elapsed_s`` and more), ``PLANDIR/assignment.parquet``
(``id``, ``worker``, ``set``, ``load``, ``radius_m``), ``PLANDIR/sets.json`` (each set's worker,
size, work, deliveries and the splits that made it) and ``PLANDIR/routing.npz`` (the routing
table).

The kNN radius ``r_q`` is **exact over the first ``--initial`` objects** in stream order
``(t, id)`` (default: 1,000,000, as in the paper's experiments; all objects if fewer), not
estimated from the statistics. Why: the runtime starts from exactly these radii, so the predicted
loads describe the state the workers will really be in. An estimate would assume objects are
uniform within a grid cell, and at city scale they are not: many places share one coordinate, and
the radii are often metres inside cells tens of kilometres wide. A query with fewer than ``k``
matching initial objects has ``r_q = inf``; it is a candidate for every object with its keywords.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from knnmon.assignment import LoadModel, Plan, Workload, make_assigner
from knnmon.costs import CostModel
from knnmon.assignment.routing import MAX_ENTRIES, RoutingTable, check_max_entries
from knnmon.assignment.summary import summarize
from knnmon.coordinator.live_routing import LiveRouting
from knnmon.errors import InvalidArgumentError
from knnmon.ingest.reading import initial_objects, load_queries

__all__ = ["DEFAULT_INITIAL", "PlanResult", "empty_plan", "explain", "make_plan", "plan_prepared", "plan_workload",
           "write_plan"]

#: The paper's number of objects seen before the stream starts.
DEFAULT_INITIAL = 1_000_000


@dataclass
class PlanResult:
    """Everything :func:`make_plan` computed."""

    plan: Plan
    workload: Workload | None  # None for :func:`empty_plan`
    model: LoadModel
    routing: LiveRouting  # (the plan's table, as the run changes it)
    summary: dict[str, Any]


def plan_workload(model: LoadModel, queries: pa.Table, objects: pa.Table, radius: np.ndarray, workers: int,
                  algorithm: str, *, beta: int = 100_000, sets_per_worker: int = 8, delivery_cost: float | None = None,
                  cost_model: str = "measured", counts: np.ndarray | None = None, handout: str = "set", seed: int = 0,
                  sample_size: int = 100_000, routing_entries: int = MAX_ENTRIES,
                  timings: dict[str, float] | None = None) -> PlanResult:
    """Assign queries whose kNN radii are known; route and summarise the plan.

    ``objects`` are the initial objects (a sample of them measures ``deliveries_per_object``).
    ``cost_model`` is what the plan balances (:mod:`knnmon.costs`); ``counts`` ``(m,)``
    are the sizes of the queries' initial kNN (``min(k, matches)``; default ``k``, an
    over-estimate for queries with fewer matches), for the expected changes. ``routing_entries``
    bounds the routing table (:meth:`RoutingTable.build`'s ``max_entries``).
    """
    timings = dict(timings or {})
    costs = CostModel.named(cost_model, delivery_cost)
    delivery_cost = costs.delivery
    assigner = make_assigner(algorithm, beta=beta, sets_per_worker=sets_per_worker, delivery_cost=delivery_cost,
                             handout=handout, seed=seed)
    assigner.check_workers(workers)
    t0 = time.perf_counter()
    if counts is None:
        counts = queries.column("k").to_numpy()
    rate = np.asarray(counts, dtype=np.float64) / max(objects.num_rows, 1)
    workload = Workload.build(model, queries, radius, costs=costs, change_rate=rate)
    plan = assigner.assign(workload, model, workers)
    timings["assign_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    routing = RoutingTable.build(workload, model, plan, max_entries=routing_entries)
    timings["routing_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sample = None
    if objects.num_rows:
        pick = np.sort(np.random.default_rng(seed).choice(objects.num_rows, min(sample_size, objects.num_rows),
                                                          replace=False))
        sample = objects.take(pa.array(pick))
    summary = summarize(plan, workload, model, routing, delivery_cost=delivery_cost, sample=sample)
    g = model.grid
    lon, lat = workload.lon, workload.lat
    outside = (lon < g.min_lon) | (lon > g.max_lon) | (lat < g.min_lat) | (lat > g.max_lat)
    unknown = np.zeros(len(workload), dtype=bool)
    unknown[workload.owner[workload.code >= len(model.keywords)]] = True
    timings["summary_s"] = time.perf_counter() - t0
    summary.update({
        "cost_model": asdict(costs),
        "initial_objects": objects.num_rows,
        "radius_inf_queries": int(np.isinf(radius).sum()),
        "queries_outside_stats_bbox": int(outside.sum()),
        "queries_with_keywords_absent_from_stats": int(unknown.sum()),
        "timings_s": {key: round(v, 3) for key, v in timings.items()},
    })
    return PlanResult(plan, workload, model, LiveRouting(routing), summary)


def plan_prepared(p, c) -> PlanResult:
    """The plan of a prepared run ``p`` (:class:`~knnmon.coordinator.runtime.preparation.Prepared`)
    with the parameters of its :class:`~knnmon.coordinator.runtime.config.RunConfig` ``c``:
    :func:`plan_workload` over the initial kNN radii, or :func:`empty_plan` without queries."""
    if not p.queries.num_rows:
        return empty_plan(p.model, c.workers, c.algorithm)
    return plan_workload(p.model, p.queries, p.initial.select(["id", "lon", "lat", "keywords"]), p.radius, c.workers,
                         c.algorithm, beta=c.beta, sets_per_worker=c.sets_per_worker, delivery_cost=c.delivery_cost,
                         cost_model=c.cost_model, counts=p.counts, routing_entries=c.routing_entries, seed=c.seed)


def empty_plan(model: LoadModel, workers: int, algorithm: str) -> PlanResult:
    """The plan of a service that starts with no queries: no sets, an empty routing table,
    zero loads. Queries registered later join it one by one (:meth:`Registrar.register <knnmon.coordinator.runtime.registration.Registrar.register>`).

    Raises
    ------
    InvalidArgumentError
        An unknown ``algorithm`` or ``workers`` outside 1..64.
    """
    make_assigner(algorithm).check_workers(workers)
    empty = np.empty(0, dtype=np.int32)
    plan = Plan(algorithm, workers, empty, empty, [], empty, {})
    routing = RoutingTable(model.grid, list(model.keywords), np.zeros(len(model.keywords), dtype=np.uint64),
                           np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64))
    summary = {"algorithm": algorithm, "workers": workers, "queries": 0, "worker_loads": [0.0] * workers, "sets": 0}
    return PlanResult(plan, None, model, LiveRouting(routing), summary)


def make_plan(objects_dir: str, queries_path: str, workers: int, algorithm: str, *,
              initial: int = DEFAULT_INITIAL, beta: int = 100_000, sets_per_worker: int = 8,
              delivery_cost: float | None = None, cost_model: str = "measured", handout: str = "set",
              seed: int = 0, processes: int = 2,
              sample_size: int = 100_000, routing_entries: int = MAX_ENTRIES) -> PlanResult:
    """Plan the assignment of a query file's queries to ``workers`` workers.

    Parameters
    ----------
    objects_dir
        An ingest output (``objects.parquet``, ``stats.parquet``, ``manifest.json``).
    initial
        Objects seen before the stream starts; ``r_q`` is exact over them.
    processes
        Processes for the radius computation (forked; see :class:`ObjectIndex`).
    sample_size
        Initial objects routed to measure ``deliveries_per_object``.

    Raises
    ------
    InvalidArgumentError, InputPathError
        Bad parameters or inputs, before any heavy work.
    """
    from knnmon.coordinator.runtime.object_index import ObjectIndex

    started = time.perf_counter()
    make_assigner(algorithm, beta=beta, sets_per_worker=sets_per_worker,
                  delivery_cost=CostModel.named(cost_model, delivery_cost).delivery,
                  handout=handout, seed=seed).check_workers(workers)
    check_max_entries(routing_entries)
    model = LoadModel.from_ingest(objects_dir)
    queries = load_queries(queries_path)
    objects = initial_objects(objects_dir, initial)
    timings = {"read_s": time.perf_counter() - started}
    t0 = time.perf_counter()
    k = queries.column("k").to_numpy()
    lon, lat = queries.column("lon").to_numpy(), queries.column("lat").to_numpy()
    if objects.num_rows:
        radius = ObjectIndex(objects).kth_distance_m(lon, lat, queries.column("keywords"), k, processes=processes)
    else:
        radius = np.full(queries.num_rows, np.inf)
    timings["radii_s"] = time.perf_counter() - t0
    result = plan_workload(model, queries, objects, radius, workers, algorithm, beta=beta,
                           sets_per_worker=sets_per_worker, delivery_cost=delivery_cost, cost_model=cost_model,
                           handout=handout, seed=seed, sample_size=sample_size,
                           routing_entries=routing_entries, timings=timings)
    result.summary["elapsed_s"] = round(time.perf_counter() - started, 3)
    return result


def write_plan(result: PlanResult, out_dir: str) -> None:
    """Write ``summary.json``, ``assignment.parquet``, ``sets.json``, ``routing.npz``."""
    os.makedirs(out_dir, exist_ok=True)
    wl, plan = result.workload, result.plan
    pq.write_table(pa.table({
        "id": pa.array(wl.ids.tolist(), type=pa.string()), "worker": plan.worker, "set": plan.set_of,
        "load": wl.load, "radius_m": wl.radius_m,
    }), os.path.join(out_dir, "assignment.parquet"))
    sets = [{"set": i, "worker": int(plan.set_worker[i]), "queries": int(len(s.members)), "work": s.work,
             "deliveries": s.deliveries, "history": s.history} for i, s in enumerate(plan.sets)]
    with open(os.path.join(out_dir, "sets.json"), "w", encoding="utf-8") as fh:
        json.dump(sets, fh, indent=1)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(result.summary, fh, indent=2)
        fh.write("\n")
    r = result.routing.table
    np.savez_compressed(os.path.join(out_dir, "routing.npz"), always=r.always, keys=r.keys, masks=r.masks, **r.regions.arrays(),
                        vocabulary=np.array(r.vocabulary, dtype=object), grid=json.dumps(r.grid.to_dict()))


def explain(result: PlanResult, query_id: str) -> str:
    """Why query ``query_id`` is where it is: its radius, region, load, set history and worker.

    Raises
    ------
    InvalidArgumentError
        If no query has that id.
    """
    wl, plan = result.workload, result.plan
    hits = np.flatnonzero(wl.ids == query_id)
    if not len(hits):
        raise InvalidArgumentError(f"--explain: no query with id {query_id!r}")
    i = int(hits[0])
    e = np.arange(wl.ptr[i], wl.ptr[i + 1])
    words = [wl.vocabulary[c] for c in wl.code[e]]
    r = wl.rects
    s = plan.sets[plan.set_of[i]]
    w = int(plan.worker[i])
    lines = [
        f"query {query_id}: k={wl.k[i]} at ({wl.lon[i]:.6f}, {wl.lat[i]:.6f}), keywords {' '.join(words)}",
        f"  kNN radius r_q = {wl.radius_m[i]:,.1f} m over the first {result.summary['initial_objects']:,} objects",
        f"  R_q = grid cells x {r.x0[i]}..{r.x1[i]}, y {r.y0[i]}..{r.y1[i]} (of {result.model.grid.n} x {result.model.grid.n})",
        f"  L(q) = {wl.entry_p[e].sum():.6g} = " + " + ".join(
            f"P(R_q, {wd}) {ld:.3g}" for wd, ld in zip(words, wl.entry_p[e])),
        f"  predicted cost {wl.load[i]:.6g} ({result.summary.get('cost_model', {}).get('name', 'paper')} cost model)",
        f"  set {int(plan.set_of[i])}: {len(s.members):,} queries, work L(Q) = {s.work:.6g}",
    ]
    lines += [f"    {n}. {step}" for n, step in enumerate(s.history, 1)] or ["    (the only set: no split)"]
    how = "the set's queries handed out one by one (paper Algorithm 2 as printed)" \
        if plan.set_worker[plan.set_of[i]] < 0 else "the whole set, longest-processing-time greedy"
    lines.append(f"  worker {w} ({how}); predicted worker load {result.summary['worker_loads'][w]:.6g}")
    return "\n".join(lines)
