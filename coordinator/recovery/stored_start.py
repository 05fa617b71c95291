"""Starting every worker from the results Redis holds: a service's restart without a search.

A service that stopped (SIGKILL, an outage it could not ride out, a worker it could not revive)
left in Redis each query's result as the last batch its worker's script applied (a script is
atomic), each worker's details hash (the objects of its results, with their times) and each
query's placement. When the service starts again with the same settings
(:mod:`~knnmon.coordinator.recovery.resume` decides), every worker is loaded from that, as one
lost worker's revival is (:mod:`~knnmon.coordinator.recovery.revival`), instead of searching
every query's kNN again and comparing it with Redis (:mod:`~knnmon.coordinator.recovery.rebuild`):

1. **the plan is the placements**: each query stays on its worker and in its set (as ``knn:plan``
   recorded them), its load from its stored result's kNN radius (the ``k``-th distance, ``inf``
   below ``k``: the radius the worker loads it with). The routing table starts coarse (each
   keyword to every worker holding a query with it, :func:`coarse_routing`), and the routing
   upkeep builds the one of the queries' regions in the background, from the loaded workers;
2. **each worker loads its stored results** (with a window each list is its first ``k``, the
   members' times from the worker's details hash; the reserve comes back with the query's next
   refill); nothing is written;
3. **one replay batch** finishes what the service was doing when it stopped: the objects
   delivered but not acknowledged (:meth:`StoredStart.replay`; at most one batch of them may
   have reached some workers' results). Each worker gets those that are not members of its
   results: with a window after an expiry at the watermark of every object delivered, and the
   refills that expiry needs, searched over the live objects but the ones it gets. A worker that
   applied that batch holds its objects that entered a result; the others did not enter and,
   since a kNN radius only grows through a refill, which sees them, do not enter again; a worker
   that did not apply it gets them all. Each result is then the exact kNN over every object
   delivered, as a full recovery computes it, and the replay's changes go to the change feed at
   :attr:`StoredStart.number` (a batch number after every one applied).

If Redis lacks something this needs (a member's details, a query's result hash), the start
raises :class:`NotResumableError` before any worker has loaded, and the service recovers in full.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.assignment import Plan, Workload
from knnmon.assignment.base import QuerySet
from knnmon.assignment.routing import RoutingTable
from knnmon.assignment.summary import summarize
from knnmon.batch import KnnColumns, ObjectBatch
from knnmon.connection import connect, with_retries
from knnmon.coordinator.live_routing import LiveRouting
from knnmon.coordinator.planning import PlanResult, empty_plan
from knnmon.coordinator.runtime.dispatch import DispatchedBatch
from knnmon.coordinator.recovery.revival import held_details
from knnmon.coordinator.recovery.revival_repair import read_details
from knnmon.costs import CostModel
from knnmon.errors import KnnmonError
from knnmon.keys import Keys
from knnmon.query import QueryColumns
from knnmon.results import ResultReader

if TYPE_CHECKING:
    from knnmon.coordinator.runtime.runtime import Runtime

__all__ = ["CHUNK", "NotResumableError", "StoredStart", "StoredWorkers", "coarse_routing"]

#: Queries per worker per load call (as a revival's: :data:`~knnmon.coordinator.recovery.revival.CHUNK`).
CHUNK = 10_000


class NotResumableError(KnnmonError):
    """Redis lacks what a start from the stored results needs (module docstring); the service
    recovers in full instead."""


@dataclass
class StoredStart:
    """What the service read for a start from the stored results (module docstring).

    Attributes
    ----------
    queries
        The ``m`` registered queries (:class:`~knnmon.query.QueryColumns`), in the order of
        the runtime's ``prepared.queries``.
    worker
        ``(m,)`` int32: each query's worker, as its hash holds it.
    set_of
        ``(m,)`` int32: each query's set in ``knn:plan`` (``-1``: none recorded).
    log
        What the objects stream holds (the service's
        :class:`~knnmon.coordinator.recovery.object_log.ObjectLog`: ``objects``, the live objects,
        ``id``, ``lon``, ``lat``, ``t``, ``keywords`` in stream order; ``pending_ids``, the
        objects delivered but not acknowledged), or a future of it (read in a child process while
        the workers load; :meth:`objects` waits for it).
    number
        The replay batch's number: after every batch applied (its change feed version is one
        more); the stream's batches go on after it.
    """

    queries: QueryColumns
    worker: np.ndarray
    set_of: np.ndarray
    log: Any
    number: int

    def objects(self) -> Any:
        """:attr:`log`, waited for."""
        return self.log.result() if isinstance(self.log, Future) else self.log

    def replay(self) -> pa.Table:
        """The live objects delivered but not acknowledged, in stream order (:meth:`objects`)."""
        log = self.objects()
        pending = log.pending_ids
        if not pending:
            return log.objects.slice(0, 0)
        return log.objects.filter(pc.is_in(log.objects.column("id"), pa.array(sorted(pending), pa.string())))

    def start(self, runtime: Runtime, p: Any) -> StoredWorkers:
        """Plan, load the workers and take the live objects (module docstring, steps 1-2) into
        ``runtime`` (the store and the workers started), its ``prepared`` ``p`` getting them as
        its initial objects; returns what was read, whose :meth:`StoredWorkers.replay` is step 3.

        Raises
        ------
        NotResumableError
            As :meth:`read`, before any worker has loaded.
        """
        c, tm, t0 = runtime.config, runtime.timings, time.perf_counter()
        url, namespace = runtime.store.url, c.store.namespace
        stored = self.read(url, namespace, c.window is not None)
        tm["stored_read_s"] = time.perf_counter() - t0
        radius, counts = self.results_of(stored)
        runtime.plan = self.plan(p.model, c, radius, counts, stored.entries, url, namespace)
        tm["plan_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        loads = stored.send(runtime.pool, runtime.plan.routing)
        got = self.objects()  # (read meanwhile, in the recovery's child process or thread)
        p.initial, p.index = got.objects, got.index
        tm["objects_wait_s"] = time.perf_counter() - t1
        runtime.hold_objects(p)
        runtime.registrar.query_worker.update(zip(self.queries.ids, self.worker.tolist()))
        runtime.pool.gather(loads)
        tm["load_s"] = time.perf_counter() - t1
        if getattr(stored, "kept", 0):
            tm["workers_kept"] = stored.kept
        return stored

    def results_of(self, stored: StoredWorkers) -> tuple[np.ndarray, np.ndarray]:
        """Each query's kNN radius (``(m,)`` float64 meters: its stored result's ``k``-th
        distance, ``inf`` below ``k``) and result size (``(m,)`` int64)."""
        return stored.lists.kth(self.queries.k), stored.lists.counts

    def read(self, redis_url: str, namespace: str, windowed: bool, chunk: int = CHUNK) -> StoredWorkers:
        """Every query's stored result (and with a window, its members' details from its
        worker's details hash), for :meth:`StoredWorkers.send`.

        Raises
        ------
        NotResumableError
            A query without its hash, or with a window a member without its details.
        StoreUnavailableError
            Redis unreachable after every retry.
        """
        client = connect(redis_url)
        try:
            reader = ResultReader(client, Keys(namespace), url=redis_url, chunk=chunk)
            lists = KnnColumns(*reader.result_columns(list(self.queries.ids)))
            entries = client.xlen(Keys(namespace).ingest_objects)
        finally:
            client.close()
        details: dict[int, Any] = {}
        for w in np.unique(self.worker).tolist() if windowed else []:
            held = held_details(read_details(redis_url, namespace, w), lists.take(self.rows_of(w)).ids)
            if held is None:
                raise NotResumableError(f"worker {w}'s details hash lacks a member of its results")
            details[w] = held
        return StoredWorkers(self, lists, details, windowed, entries)

    def rows_of(self, worker: int) -> np.ndarray:
        """``(q,)`` int64: the rows of :attr:`queries` on ``worker``."""
        return np.flatnonzero(self.worker == worker)

    def plan(self, model, config, radius: np.ndarray, counts: np.ndarray, objects: int, redis_url: str,
             namespace: str) -> PlanResult:
        """The plan that keeps every query where it is (module docstring, step 1): its sets as
        ``knn:plan`` recorded them (a set that no longer has members is kept empty), the coarse
        routing table (:func:`coarse_routing`), and each worker's predicted load the sum of its
        queries' costs over ``radius`` (``(m,)`` float64 meters; ``counts``: ``(m,)`` their stored
        results' sizes, for the expected changes per object of about ``objects``; ``config``: the
        run's :class:`~knnmon.coordinator.runtime.config.RunConfig`)."""
        q = self.queries
        if not len(q):
            return empty_plan(model, config.workers, config.algorithm)
        table = q.to_table()
        costs = CostModel.named(config.cost_model, config.delivery_cost)
        workload = Workload.build(model, table, radius, costs=costs,
                                  change_rate=np.asarray(counts, dtype=np.float64) / max(objects, 1))
        sets, set_worker = _recorded_sets(redis_url, namespace, self.set_of, config.workers)
        plan = Plan(config.algorithm, config.workers, self.worker.astype(np.int32),
                    np.where(self.set_of < len(sets), self.set_of, -1).astype(np.int32), sets, set_worker)
        routing = coarse_routing(workload, model, plan.worker)
        return PlanResult(plan, workload, model, LiveRouting(routing),
                          summarize(plan, workload, model, routing, delivery_cost=costs.delivery))


def coarse_routing(workload: Workload, model, worker: np.ndarray) -> RoutingTable:
    """A routing table without cells: each keyword goes everywhere to every worker holding a
    query with it (``worker``: ``(m,)`` each query's). A superset of what the queries need, made
    in one pass; the runtime's routing upkeep builds the table of their regions in the background
    and swaps it in (:class:`~knnmon.coordinator.runtime.routing_upkeep.RoutingUpkeep`)."""
    always = np.zeros(len(workload.vocabulary), dtype=np.uint64)
    np.bitwise_or.at(always, workload.code, np.left_shift(np.uint64(1), worker[workload.owner].astype(np.uint64)))
    return RoutingTable(model.grid, list(workload.vocabulary), always, np.empty(0, dtype=np.int64),
                        np.empty(0, dtype=np.uint64))


def _recorded_sets(redis_url: str, namespace: str, set_of: np.ndarray, workers: int
                   ) -> tuple[list[QuerySet], np.ndarray]:
    """The query sets ``knn:plan`` recorded, with their members from ``set_of`` (each query's
    set, ``-1``: none); none if the record is missing, unreadable, or names a region that is not
    four numbers or a worker outside ``-1 .. workers - 1``."""
    client = connect(redis_url)
    try:
        fields = with_retries(lambda: client.hgetall(Keys(namespace).plan), "reading the plan", redis_url)
    finally:
        client.close()
    sets, on = [], []
    try:
        for i in range(sum(1 for f in fields if f.startswith("set:"))):
            s = json.loads(fields[f"set:{i}"])
            region, worker = tuple(float(x) for x in s["region"]), int(s["worker"])
            if len(region) != 4 or not -1 <= worker < workers:  # (any client may have written the record)
                raise ValueError(f"set {i}: region {region[:8]}, worker {worker}")
            sets.append(QuerySet(np.flatnonzero(set_of == i), float(s["work"]), list(s["history"]), region))
            on.append(worker)
    except (KeyError, ValueError, TypeError, OverflowError):
        return [], np.empty(0, dtype=np.int32)
    return sets, np.asarray(on, dtype=np.int32)


@dataclass
class StoredWorkers:
    """The stored results read for a start (:meth:`StoredStart.read`): ``lists`` aligned with
    ``start.queries``, ``details`` per worker with a window (each one's members, as
    :class:`~knnmon.batch.ObjectColumns`), and the objects stream's length (``entries``, about
    the objects the results are over: the plan's expected changes per object)."""

    start: StoredStart
    lists: KnnColumns
    details: dict[int, Any]
    first_k: bool
    entries: int = 0

    def send(self, pool, routing: LiveRouting, chunk: int = CHUNK) -> list:
        """Hand each worker its queries with their stored results (``write=False``: Redis holds
        them), :data:`CHUNK` at a time, with their keywords' codes in ``routing``; returns the
        calls, not waited for."""
        q, pending = self.start.queries, []
        for w in range(pool.size):
            mine = self.start.rows_of(w)
            for s in range(0, len(mine), chunk):
                part = mine[s:s + chunk]
                queries = q.take(part)
                codes = {x: routing.code(x) for kws in queries.keywords for x in kws}
                pending.append(pool.load(w, queries, self.lists.take(part), self.details.get(w, {}), write=False,
                                         vocabulary=codes, first_k=self.first_k, rebuild=s + chunk >= len(mine)))
        return pending

    def holds(self, pool, ids: list[str]) -> dict[int, set[str]]:
        """Of the objects ``ids``, those each worker's results hold (as Redis stores them)."""
        return {w: set(ids).intersection(self.lists.take(self.start.rows_of(w)).ids) for w in range(pool.size)}

    def replay(self, runtime: Runtime) -> int:
        """The replay batch (module docstring, step 3), collected; returns its objects."""
        d, pool, table = runtime.dispatcher, runtime.pool, self.start.replay()
        t0 = time.perf_counter()
        ids = np.asarray(table.column("id").to_pylist(), dtype=object)
        held = self.holds(pool, ids.tolist())  # (before the expiry, as Redis holds the results)
        window = d.window
        cutoff = window.cutoff if window is not None else None
        routed, pair_obj, pair_code, _ = d._route(table)
        shared = pool.share(ObjectBatch(self.start.number, routed, pair_obj, pair_code))
        if cutoff is not None:
            needs = pool.gather([pool.expire(w, cutoff) for w in range(pool.size)])
        calls, rows = [], {}
        for w in range(pool.size):
            holds = held[w]
            rows[w] = np.asarray([i for i, o in enumerate(ids.tolist()) if o not in holds], dtype=np.int64)
            if cutoff is None:
                calls.append(pool.process(w, shared, rows[w]))
                continue
            refills = d.refill_one(w, needs[w], frozenset(ids[rows[w]].tolist())) if len(needs[w].ids) else None
            calls.append(pool.process(w, shared, rows[w], cutoff=cutoff, refills=refills))
        batch = DispatchedBatch(self.start.number, len(ids), 0, sum(len(r) for r in rows.values()), calls, t0, 0.0,
                                0.0, shared, rows, cutoff=cutoff)
        d.collect(batch)
        return len(ids)
