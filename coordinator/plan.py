"""``knnmon plan``: load model + exact kNN radii + an assignment algorithm -> a plan on disk.

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

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from knnmon.assignment import ALGORITHMS, LoadModel, Plan, Workload, make_assigner
from knnmon.assignment.costs import COST_MODELS, CostModel
from knnmon.assignment.routing import MAX_ENTRIES, RoutingTable, check_max_entries
from knnmon.assignment.summary import summarize
from knnmon.errors import InputPathError, InvalidArgumentError
from knnmon.ingest.queries import read_objects

__all__ = ["PlanResult", "empty_plan", "make_plan", "plan_workload", "stream_order", "write_plan", "explain", "format_summary", "load_queries",
           "initial_objects", "add_plan_command"]

#: The paper's number of objects seen before the stream starts.
DEFAULT_INITIAL = 1_000_000


@dataclass
class PlanResult:
    """Everything :func:`make_plan` computed."""

    plan: Plan
    workload: Workload | None  # None for :func:`empty_plan`
    model: LoadModel
    routing: RoutingTable
    summary: dict[str, Any]


def load_queries(path: str) -> pa.Table:
    """Read a query file (``id``, ``lon``, ``lat``, ``keywords``, ``k``) and check it.

    Raises
    ------
    InputPathError
        The file does not exist or is not Parquet.
    InvalidArgumentError
        No queries, missing columns, duplicate ids, ``k < 1``, no keyword, or coordinates out of
        range; the message gives the count and the first offending ids.
    """
    if not os.path.exists(path):
        raise InputPathError(f"query file does not exist: {path}")
    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowException) as ex:
        raise InputPathError(f"cannot read query file {path}: {ex}") from ex
    missing = {"id", "lon", "lat", "keywords", "k"} - set(t.column_names)
    if missing:
        raise InvalidArgumentError(f"{path}: query file lacks column(s) {sorted(missing)}")
    if t.num_rows == 0:
        raise InvalidArgumentError(f"{path}: the query file holds no queries")
    t = t.select(["id", "lon", "lat", "keywords", "k"])
    lon, lat, k = (t.column(c).to_numpy(zero_copy_only=False) for c in ("lon", "lat", "k"))
    n_kw = pc.list_value_length(t.column("keywords")).fill_null(0).to_numpy(zero_copy_only=False)
    ids = t.column("id")
    problems = {
        "k < 1": k < 1,
        "no keyword": n_kw < 1,
        "longitude outside [-180, 180] or not finite": ~(np.abs(lon) <= 180),
        "latitude outside [-90, 90] or not finite": ~(np.abs(lat) <= 90),
    }
    for what, bad in problems.items():
        if bad.any():
            first = ids.filter(pa.array(bad)).slice(0, 5).to_pylist()
            raise InvalidArgumentError(f"{path}: {int(bad.sum())} invalid queries ({what}), e.g. {first}")
    if pc.count_distinct(ids).as_py() != t.num_rows:
        raise InvalidArgumentError(f"{path}: query ids are not unique")
    return t


def stream_order(objects: pa.Table, shuffle: int | None = None) -> pa.Table:
    """Objects in stream order ``(t, id)``, or shuffled with seed ``shuffle``.

    Ingest writes ``objects.parquet`` in ``(t, id)`` order already; that is checked (one pass)
    and the sort skipped then.
    """
    if shuffle is not None:
        return objects.take(pa.array(np.random.default_rng(shuffle).permutation(objects.num_rows)))
    t = objects.column("t").to_numpy()
    ordered = bool(np.all(np.diff(t) >= 0))
    tie = np.flatnonzero(np.diff(t) == 0) if ordered else np.empty(0, dtype=np.int64)
    if len(tie):
        ids = objects.column("id")
        ordered = bool(pc.all(pc.less(ids.take(pa.array(tie)), ids.take(pa.array(tie + 1)))).as_py())
    if ordered:
        return objects
    return objects.take(pc.sort_indices(objects, sort_keys=[("t", "ascending"), ("id", "ascending")]))


def initial_objects(objects_dir: str, n: int) -> pa.Table:
    """The first ``n`` objects in stream order ``(t, id)`` (all if fewer), with ``id``, ``lon``,
    ``lat``, ``keywords``."""
    if n < 0:
        raise InvalidArgumentError(f"--initial must be >= 0; got {n}")
    objects = stream_order(read_objects(objects_dir, ["id", "lon", "lat", "t", "keywords"]), None)
    return objects.slice(0, min(n, objects.num_rows)).select(["id", "lon", "lat", "keywords"])


def plan_workload(model: LoadModel, queries: pa.Table, objects: pa.Table, radius: np.ndarray, workers: int,
                  algorithm: str, *, beta: int = 100_000, sets_per_worker: int = 8, delivery_cost: float | None = None,
                  cost_model: str = "measured", counts: np.ndarray | None = None, handout: str = "set", seed: int = 0,
                  sample_size: int = 100_000, routing_entries: int = MAX_ENTRIES,
                  timings: dict[str, float] | None = None) -> PlanResult:
    """Assign queries whose kNN radii are known; route and summarise the plan.

    ``objects`` are the initial objects (a sample of them measures ``deliveries_per_object``).
    ``cost_model`` is what the plan balances (:mod:`knnmon.assignment.costs`); ``counts`` ``(m,)``
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
    return PlanResult(plan, workload, model, routing, summary)


def empty_plan(model: LoadModel, workers: int, algorithm: str) -> PlanResult:
    """The plan of a service that starts with no queries: no sets, an empty routing table,
    zero loads. Queries registered later join it one by one (:meth:`Runtime.register_query`).

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
    return PlanResult(plan, None, model, routing, summary)


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
    from knnmon.workers.object_index import ObjectIndex

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
    r = result.routing
    np.savez_compressed(os.path.join(out_dir, "routing.npz"), always=r.always, keys=r.keys, masks=r.masks,
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


def format_summary(s: dict[str, Any]) -> str:
    """A readable table of a plan summary."""
    head = f"{'worker':>6} {'queries':>9} {'work L(w)':>12} {'deliv D(w)':>11} {'load':>12}"
    rows = [head, "-" * len(head)]
    for w in range(s["workers"]):
        rows.append(f"{w:>6} {s['worker_queries'][w]:>9,} {s['worker_work'][w]:>12.4f} "
                    f"{s['worker_deliveries'][w]:>11.4f} {s['worker_loads'][w]:>12.4f}")
    rows.append(f"algorithm {s['algorithm']}: {s['queries']:,} queries in {s['sets']} sets on {s['workers']} workers; "
                f"imbalance (max/mean) {s['imbalance']:.3f}; deliveries per object {s['deliveries_per_object']:.2f}; "
                f"{s['elapsed_s']:.1f} s")
    notes = [(s["queries_outside_stats_bbox"], "queries lie outside the statistics' bounding box (clamped to edge cells)"),
             (s["queries_with_keywords_absent_from_stats"], "queries have keywords absent from the statistics (load 0 for those, still routed)"),
             (s["radius_inf_queries"], "queries have fewer than k matching initial objects (r_q = inf)"),
             (s.get("routing_pairs_promoted", 0),
              f"(worker, keyword) pairs of {s.get('routing_pairs', 0):,} are routed everywhere to keep the routing "
              f"table within {s.get('routing_max_entries', 0):,} entries (+{s.get('routing_promoted_extra_deliveries', 0):.4f} "
              "expected deliveries per object)")]
    rows += [f"note: {n:,} {text}" for n, text in notes if n]
    return "\n".join(rows)


def _run(a: argparse.Namespace) -> int:
    result = make_plan(a.objects, a.queries, a.workers, a.algorithm, initial=a.initial, beta=a.beta,
                       sets_per_worker=a.sets_per_worker, delivery_cost=a.delivery_cost, cost_model=a.cost_model,
                       handout=a.handout, seed=a.seed, processes=a.processes,
                       routing_entries=a.routing_entries)
    write_plan(result, a.out)
    print(format_summary(result.summary))
    if a.explain:
        print()
        print(explain(result, a.explain))
    return 0


def add_routing_entries_argument(p: argparse.ArgumentParser) -> None:
    """``--routing-entries N``: the routing table's bound (``knnmon plan`` and ``knnmon run``)."""
    p.add_argument("--routing-entries", type=int, default=MAX_ENTRIES, metavar="N",
                   help=f"bound the routing table at N (keyword, cell) entries, ~16 bytes each (default "
                        f"{MAX_ENTRIES:,}); beyond it, the (worker, keyword) pairs that add the fewest deliveries "
                        "are routed everywhere instead (results stay exact)")


def add_plan_command(sub: Any) -> None:
    """Register ``plan`` on a root parser's subparsers."""
    p = sub.add_parser("plan", help="assign queries to workers (load model + assignment algorithm)")
    p.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    p.add_argument("--queries", required=True, metavar="FILE", help="a query file (knnmon queries generate)")
    p.add_argument("--workers", type=int, required=True, metavar="W")
    p.add_argument("--algorithm", required=True, choices=sorted(ALGORITHMS))
    p.add_argument("--initial", type=int, default=DEFAULT_INITIAL, metavar="N",
                   help=f"objects seen before the stream; r_q is exact over them (default {DEFAULT_INITIAL:,})")
    p.add_argument("--beta", type=int, default=100_000, help="sets above BETA queries split by space (default 100,000)")
    p.add_argument("--sets-per-worker", type=int, default=8, help="proposed: stop at this many sets per worker (default 8)")
    p.add_argument("--cost-model", choices=COST_MODELS, default="measured",
                   help="what the plan balances: the measured worker cost (deliveries and expected result "
                        "changes; default) or the paper's L(q) (expected keyword matches)")
    p.add_argument("--delivery-cost", type=float, default=None,
                   help="weight of one delivery (lambda; default: 10.9 us under the measured model, 1 under the "
                        "paper's)")
    p.add_argument("--handout", choices=("set", "query"), default="set",
                   help="proposed: assign whole sets (default) or query by query as the paper prints it")
    p.add_argument("--seed", type=int, default=0, help="random assignment and delivery sample seed")
    add_routing_entries_argument(p)
    p.add_argument("--processes", type=int, default=2, help="processes for the kNN radii (default 2)")
    p.add_argument("--out", required=True, metavar="PLANDIR")
    p.add_argument("--explain", metavar="QID", help="also say how query QID was placed")
    p.set_defaults(func=_run)
