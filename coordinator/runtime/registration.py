"""Which worker holds which query: the initial load and registration at run time.

- :meth:`Registrar.load` hands each worker the queries the plan gave it, with their exact
  initial kNN (:class:`~knnmon.coordinator.runtime.preparation.Prepared`);
- :meth:`Registrar.register` adds queries at run time: each starts from its exact kNN over every
  object seen (:class:`~knnmon.coordinator.runtime.object_store.ObjectStore`, one vectorised
  search for all), is placed by :meth:`Registrar.place` (``docs/concepts.md``, "Runtime registration"),
  and the routing table learns its region;
- :meth:`Registrar.unregister` removes a query and its keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from knnmon.coordinator.planning import PlanResult
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.preparation import Prepared
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import InvalidQueryError, WorkerLostError
from knnmon.query import Query, QueryColumns
from knnmon.reports import WorkerStats
from knnmon.workers.placements import clear_object_details, record_placements

if TYPE_CHECKING:
    from knnmon.coordinator.recovery.revival import Revival

__all__ = ["LOAD_CHUNK", "Registrar"]

#: Queries per worker per call of the initial load (:meth:`Registrar.load`). Small: a worker
#: unpickles each call's payload (lists, tuples, floats: ~2-4 KB per query) among what it keeps,
#: and Python's allocator hands back only whole 1 MiB arenas, so the memory a worker keeps after
#: its load grows with the part's size (a Ray worker loading 40,000 queries kept 175 MB over an
#: idle one in 1 part, 85 MB in 8 parts, 66 MB in 20: benchmarks/worker_load_parts.py at 68de8c7).
LOAD_CHUNK = 2_000


class Registrar:
    """The queries of one run and their workers.

    Attributes
    ----------
    query_worker : dict of str to int
        Each registered query's worker.
    worker_loads : numpy.ndarray
        ``(W,)`` float64: each worker's predicted load (the plan's), plus the mean query load
        per query registered since.
    worker_queries : numpy.ndarray
        ``(W,)`` int64: queries per worker.
    placements_written : int
        Query hashes whose placement a resuming load rewrote (the others held it already).

    A worker lost during :meth:`register` or :meth:`unregister` is revived from Redis by
    :attr:`revive_worker` and the operation completed on the new worker: the registrations its
    script had not written are sent again, an unregister it had not applied is sent again.
    """

    def __init__(self, pool: WorkerPool, plan: PlanResult, objects: ObjectStore, reserve: int = 0, *,
                 feed_version: Callable[[], int] = lambda: 0,
                 revive_worker: Callable[..., Revival | None] | None = None) -> None:
        self.pool, self.plan, self.objects, self.reserve = pool, plan, objects, reserve
        self.query_worker: dict[str, int] = {}
        self.unregistered = 0  # queries unregistered so far
        self.placements_written = 0
        self.worker_loads = np.array(plan.summary["worker_loads"], dtype=np.float64)
        self.worker_queries = np.bincount(plan.plan.worker, minlength=pool.size).astype(np.int64)
        #: The change feed's version of a registration now: the stream batches applied so far
        #: (:class:`~knnmon.batch.BatchChanges`; the runtime's dispatcher's).
        self.feed_version = feed_version
        #: Revives a worker lost during a registration or an unregister, from Redis (the
        #: runtime's :meth:`Runtime.revive_idle`); ``None``, or a ``None`` answer: the loss is
        #: raised (:class:`~knnmon.errors.WorkerLostError`).
        self.revive_worker = revive_worker

    # -- the initial load ----------------------------------------------------------------------
    def load(self, prepared: Prepared, *, resume: bool = False, redis_url: str | None = None,
             namespace: str = "knn", chunk: int | None = None) -> float:
        """Hand every worker its planned queries with their initial kNN; returns seconds spent.

        Each worker gets its queries in parts of ``chunk`` (default :data:`LOAD_CHUNK`; at most
        two parts per worker in flight: the next is built while the workers take the last), each
        with its keywords' codes in the routing table, so what is in flight at once (the
        coordinator's payloads, Ray's object store, each worker's copy) is bounded by ``2 x W x
        chunk`` queries, whatever the number of queries.

        ``resume``: Redis already holds these queries and exactly these results (a service
        resuming, :mod:`knnmon.coordinator.recovery.rebuild`): nothing is rewritten but each
        query's ``worker`` field and the workers' object details (``knn:objects:{worker}``: the
        plan may move queries between workers), ``redis_url`` and ``namespace`` say where.
        """
        t0 = time.perf_counter()
        chunk = LOAD_CHUNK if chunk is None else int(chunk)
        q = prepared.queries
        lon, lat = q.column("lon").to_numpy(), q.column("lat").to_numpy()
        k = q.column("k").to_numpy().astype(np.int64)
        routing, plan = self.plan.routing, self.plan.plan
        with_sets = len(plan.set_of) == q.num_rows
        if resume and redis_url is not None:
            clear_object_details(redis_url, namespace)
        mine_of = [np.flatnonzero(plan.worker == w) for w in range(self.pool.size)]
        last: list = []
        for s in range(0, max((len(m) for m in mine_of), default=0) or 1, chunk):
            pending = []
            for w, mine_all in enumerate(mine_of):
                mine = mine_all[s:s + chunk]
                if s and not len(mine):
                    continue
                sel = mine.tolist()
                part = q.take(pa.array(mine, type=pa.int64())).select(["id", "keywords"])
                ids, kws = part.column("id").to_pylist(), part.column("keywords").to_pylist()
                rows = np.concatenate([prepared.knn_rows(i) for i in sel] + [np.empty(0, np.int64)])
                info = self.objects.initial_info(rows)
                columns = QueryColumns(ids, lon[mine], lat[mine], kws, k[mine])
                codes = {x: routing.code(x) for words in kws for x in words}
                pending.append(self.pool.load(w, columns, prepared.knn_lists(sel), info,
                                              version=prepared.first_batch, write=not resume, details=resume,
                                              sets=plan.set_of[mine].tolist() if with_sets else None,
                                              vocabulary=codes, rebuild=s + chunk >= len(mine_all)))
                for qid in ids:
                    self.query_worker[qid] = w
            self.pool.gather(last)  # (a worker takes its calls in order: this part waits behind it)
            last = pending
        self.pool.gather(last)
        if resume and self.query_worker and redis_url is not None:
            ids = q.column("id").to_pylist()
            sets = dict(zip(ids, plan.set_of.tolist())) if len(plan.set_of) == len(ids) else {}
            self.placements_written = record_placements(redis_url, namespace, list(self.query_worker.items()), sets,
                                                        held=prepared.placed)
        return time.perf_counter() - t0

    # -- at run time ---------------------------------------------------------------------------
    def register(self, queries: Sequence[Query]) -> list[int]:
        """Add queries at run time; returns their workers (module docstring).

        Raises
        ------
        InvalidQueryError
            Before anything is registered: an id registered already, or twice in ``queries``.
        """
        fresh: set[str] = set()
        for q in queries:
            if q.id in self.query_worker or q.id in fresh:
                raise InvalidQueryError(f"query {q.id!r} is already registered")
            fresh.add(q.id)
        if not queries:
            return []
        cap = [q.k + self.reserve for q in queries]  # with a reserve, the k + reserve nearest
        topk, info = self.objects.knn_v([q.lon for q in queries], [q.lat for q in queries],
                                        [q.keywords for q in queries], cap)
        radius = topk.kth(cap)
        rect = self.plan.model.rects(np.array([q.lon for q in queries]), np.array([q.lat for q in queries]), radius)
        routing = self.plan.routing
        mean_load = self.worker_loads.sum() / max(int(self.worker_queries.sum()), 1)
        workers, mine = [], {}
        for i, q in enumerate(queries):
            w = self.place(q.lon, q.lat)
            self.query_worker[q.id] = w
            self.worker_queries[w] += 1
            self.worker_loads[w] += mean_load
            workers.append(w)
            mine.setdefault(w, []).append(i)
        routing.add_many([[routing.code(x) for x in q.keywords] for q in queries], rect.x0, rect.y0, rect.x1, rect.y1,
                         workers)
        def send(w: int, sel: list[int]) -> Pending[None]:
            part = topk.take(sel)
            return self.pool.register(
                w, QueryColumns.of([queries[i] for i in sel]), part,
                info.subset(part.ids), vocabulary={x: routing.code(x) for i in sel for x in queries[i].keywords},
                version=self.feed_version())

        pending = [send(w, sel) for w, sel in mine.items()]
        while True:
            try:
                self.pool.gather(pending)
                return workers
            except WorkerLostError as ex:  # revived from Redis: it holds what its script wrote
                revival = self.revive_worker(ex.worker) if self.revive_worker is not None else None
                if revival is None:
                    raise
                again = set(revival.absent)
                sel = [i for i in mine.get(ex.worker, []) if queries[i].id in again]
                pending = [p for p in pending if p.worker != ex.worker] + ([send(ex.worker, sel)] if sel else [])

    def place(self, lon: float, lat: float) -> int:
        """The worker of a new query: of the plan's sets whose region holds it, the one on the
        least-loaded worker, unless that worker is above 1.1x the mean load; else the
        least-loaded worker (``docs/concepts.md``, "Runtime registration"). Ties by fewer queries."""
        loads, counts = self.worker_loads, self.worker_queries
        sets, set_worker = self.plan.plan.sets, self.plan.plan.set_worker
        holders = [int(set_worker[i]) for i, s in enumerate(sets)
                   if s.region[0] <= lon <= s.region[2] and s.region[1] <= lat <= s.region[3] and set_worker[i] >= 0]
        least = int(np.lexsort((counts, loads))[0])
        if not holders:
            return least
        w = min(holders, key=lambda x: (loads[x], counts[x]))
        return least if loads[w] > 1.1 * loads.mean() else w

    def unregister(self, qid: str) -> bool:
        """Remove a query and delete its keys; ``False`` if no such query."""
        w = self.query_worker.pop(qid, None)
        if w is None:
            return False
        self.worker_queries[w] -= 1
        self.unregistered += 1
        while True:
            try:
                self.pool.gather([self.pool.unregister(w, qid, self.feed_version())])
                return True
            except WorkerLostError as ex:  # revived with the query if Redis still holds it: sent again
                revival = self.revive_worker(ex.worker, [qid]) if self.revive_worker is not None else None
                if revival is None:
                    raise
                if qid in revival.absent:  # its keys were deleted before the worker died
                    return True

    def result(self, qid: str) -> list[tuple[str, float]]:
        """A query's current kNN as its worker holds it (Redis holds the same)."""
        return self.pool.gather([self.pool.result(self.query_worker[qid], qid)])[0]

    def stats(self) -> list[WorkerStats]:
        """Each worker's :meth:`~knnmon.workers.worker.KnnWorker.stats`."""
        return self.pool.gather([self.pool.stats(w) for w in range(self.pool.size)])
