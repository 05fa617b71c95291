"""Dispatch: route each object batch only to the workers that may need it, and collect them.

Per batch (``SPEC.md``, "Routing"; Tsuruoka et al. 2019, §4.3): drop ids seen before (counted),
encode the objects' keywords with the routing table's vocabulary, look up each object's
(grid cell, keyword) pairs in the :class:`~knnmon.assignment.routing.RoutingTable` (a worker
bit mask per object), and send the batch once (:class:`~knnmon.batch.ObjectBatch`, into Ray's
object store) with each worker's rows. :meth:`Dispatcher.collect` waits for the workers and for
their queued writes, and measures the batch (:class:`~knnmon.coordinator.runtime.metrics.BatchReport`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from knnmon.assignment.routing import RoutingTable
from knnmon.batch import ObjectBatch, WorkerReport
from knnmon.coordinator.runtime.metrics import BatchReport
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool

__all__ = ["DispatchedBatch", "Dispatcher"]


@dataclass(frozen=True)
class DispatchedBatch:
    """A batch sent to its workers and not yet collected."""

    number: int
    objects: int
    duplicates: int
    deliveries: int
    pending: list[Pending]
    t0: float
    route_ms: float
    route_cpu_ms: float
    shared: Any = None  # the ObjectBatch as the workers receive it (to send again to a revived worker)
    rows: dict[int, np.ndarray] = field(default_factory=dict)  # each worker's rows


class Dispatcher:
    """Routes batches of one run (module docstring).

    Parameters
    ----------
    pool
        The run's workers.
    routing
        The plan's routing table (registration at run time extends it).
    objects
        The object store: each batch joins it, so a query registered next starts from a kNN
        over it.
    seen
        Ids of the objects seen so far (the initial ones); a batch's repeats of them are dropped.
    """

    def __init__(self, pool: WorkerPool, routing: RoutingTable, objects: ObjectStore, seen: set[str]) -> None:
        self.pool, self.routing, self.objects, self.seen = pool, routing, objects, seen
        self.next_batch = 0

    def drop_seen(self, batch: pa.Table) -> tuple[pa.Table, int]:
        """``batch`` without the ids seen before (or twice in it; the first one counts), and how
        many were dropped; the rest are seen from now on."""
        fresh, dup = [], 0
        for i, oid in enumerate(batch.column("id").to_pylist()):
            if oid in self.seen:
                dup += 1
            else:
                self.seen.add(oid)
                fresh.append(i)
        return (batch.take(pa.array(fresh, type=pa.int64())) if dup else batch), dup

    def dispatch(self, batch: pa.Table) -> DispatchedBatch:
        """Route ``batch`` (``id``, ``lon``, ``lat``, ``t``, ``keywords``) and send each worker
        its objects, without waiting."""
        t0, c0 = time.perf_counter(), time.thread_time()
        batch, dup = self.drop_seen(batch)
        lon, lat = batch.column("lon").to_numpy(), batch.column("lat").to_numpy()
        keywords = batch.column("keywords").combine_chunks()
        owner, codes = self.routing.encode(keywords)
        keep = codes >= 0
        pair_obj, pair_code = owner[keep], codes[keep]
        masks = self.routing.route_v(self.routing.grid.cell_of(lon, lat), pair_obj, pair_code)
        number = self.next_batch
        self.next_batch += 1
        table = pa.table({"id": batch.column("id"), "lon": lon, "lat": lat, "t": batch.column("t").to_numpy(),
                          "keywords": keywords})
        shared = self.pool.share(ObjectBatch(number, table, pair_obj, pair_code))
        pending, sent, rows = [], 0, {}
        for w in range(self.pool.size):
            mine = np.flatnonzero((masks >> np.uint64(w)) & np.uint64(1))
            if len(mine):
                pending.append(self.pool.call(w, "process_rows", shared, mine))
                sent += len(mine)
                rows[w] = mine
        route_ms = (time.perf_counter() - t0) * 1e3
        route_cpu_ms = (time.thread_time() - c0) * 1e3  # not inflated by workers already running
        self.objects.append(batch)
        return DispatchedBatch(number, batch.num_rows, dup, sent, pending, t0, route_ms, route_cpu_ms, shared, rows)

    def collect(self, d: DispatchedBatch) -> BatchReport:
        """Wait for a dispatched batch's workers and their writes; its :class:`BatchReport`.

        Raises
        ------
        WorkerLostError
            A worker of the batch died.
        StoreUnavailableError
            A worker's write failed after every retry.
        """
        reports: list[WorkerReport] = self.pool.gather(d.pending)
        route_ms, route_cpu_ms = d.route_ms, d.route_cpu_ms
        if self.pool.inline:  # the workers ran inside the dispatch: not routing (the write
            # thread's CPU joins the reports below, and was never the dispatching thread's)
            route_cpu_ms -= sum(r.cpu_s - r.redis_server_s for r in reports) * 1e3
            route_ms -= sum(r.busy_s for r in reports) * 1e3
        queued = [i for i, r in enumerate(reports) if r.write_queued]
        if queued:  # the batch is done when its writes are in Redis
            writes = self.pool.gather([self.pool.call(reports[i].worker, "written", d.number) for i in queued])
            for i, w in zip(queued, writes):
                reports[i] = reports[i].with_write(w)
        update_ms = (time.perf_counter() - d.t0) * 1e3
        return BatchReport.of(d.number, d.objects, d.duplicates, d.deliveries, self.pool.size, update_ms, route_ms,
                              route_cpu_ms, reports)
