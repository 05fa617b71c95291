"""Dispatch: route each object batch only to the workers that may need it, and collect them.

Per batch (``docs/concepts.md``, "Routing"; Tsuruoka et al. 2019, §4.3): drop ids seen before (counted),
encode the objects' keywords with the routing table's vocabulary, look up each object's
(grid cell, keyword) pairs in the :class:`~knnmon.coordinator.live_routing.LiveRouting` (a worker
bit mask per object), and send the batch once (:class:`~knnmon.batch.ObjectBatch`, into Ray's
object store) with each worker's rows. :meth:`Dispatcher.collect` waits for the workers and for
their queued writes, and measures the batch (:class:`~knnmon.coordinator.runtime.metrics.BatchReport`).

With a window (:class:`~knnmon.window.Window`), a batch first moves the watermark: its late
objects are dropped (counted), the expired objects leave the object store and the ids seen. Each
worker announced after its last batch the lists whose reserve runs out soon, with their deadlines
(:class:`~knnmon.refills.DueLists`); the coordinator searches the exact kNN of those due by the new
cutoff over the live objects (one vectorised search for all) and sends each worker its
:class:`~knnmon.refills.Refills` with the batch, without asking first; the routing table learns
the refilled queries' larger regions. A worker whose expiry finds a list short that no refill
came for returns it unapplied (:attr:`~knnmon.reports.WorkerReport.short`), and the batch goes
to it again with that refill (:meth:`Dispatcher.settle`, before the next batch is sent).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from knnmon.batch import KnnColumns, ObjectBatch
from knnmon.coordinator.live_routing import LiveRouting
from knnmon.coordinator.runtime.due_lists import DueTable
from knnmon.coordinator.runtime.metrics import BatchReport
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.seen_ids import SeenIds
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.reports import WorkerReport
from knnmon.window import Window

__all__ = ["Admission", "DispatchedBatch", "Dispatcher"]


@dataclass(frozen=True)
class DispatchedBatch:
    """A batch sent to its workers and not yet collected."""

    number: int
    objects: int
    duplicates: int
    deliveries: int
    pending: list[Pending[WorkerReport]]
    t0: float
    route_ms: float
    route_cpu_ms: float
    shared: Any = None  # the ObjectBatch as the workers receive it (to send again to a revived worker)
    rows: dict[int, np.ndarray] = field(default_factory=dict)  # each worker called: its rows (maybe none)
    late: int = 0  # with a window: objects that arrived expired
    refill_ms: float = 0.0  # with a window: the expiry and the refill search
    cutoff: int | None = None  # with a window: the cutoff the batch moved to
    ids: frozenset[str] = frozenset()  # with a window: the ids of the batch's objects (the store holds them)


@dataclass(frozen=True)
class Admission:
    """Which of a batch's objects the runtime takes (:meth:`Dispatcher.admit`).

    Attributes
    ----------
    duplicate, late
        ``(n,)`` bool, never both at once.
    cutoff
        With a window, the cutoff (epoch ms) the batch moves to, else ``None``.
    """

    duplicate: np.ndarray
    late: np.ndarray
    cutoff: int | None


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
        Ids of the objects seen so far (the initial ones; a sequence or an Arrow string array);
        a batch's repeats of them are dropped (:class:`~knnmon.coordinator.runtime.seen_ids.SeenIds`).
    seen_times
        With a window: ``(len(seen),)`` int64, the times (epoch ms) of ``seen``'s objects, so
        that their ids are forgotten when they expire.
    window
        The stream's window (``None``: append-only).
    rects
        With a window: ``(lon, lat, radius_m) -> Rects`` of query regions in grid cells (the
        plan's :meth:`~knnmon.assignment.loadmodel.LoadModel.rects`), for refilled queries.
    first_batch
        The number of the first batch: the stream batches applied before (a resumed service's);
        batch ``b``'s changes carry the change feed's version ``b + 1``.
    """

    def __init__(self, pool: WorkerPool, routing: LiveRouting, objects: ObjectStore, seen: Sequence[str] | pa.Array, *,
                 seen_times: np.ndarray | None = None, window: Window | None = None, rects=None,
                 first_batch: int = 0) -> None:
        self.pool, self.routing, self.objects = pool, routing, objects
        routing.prepare()  # (not in the first batch's routing time)
        self.seen = SeenIds(seen, seen_times, windowed=window is not None)
        self.window, self.rects = window, rects
        self.next_batch = first_batch
        #: With a window, the last batch's refill step in parts (ms): ``expire`` (the store and
        #: the seen ids), ``search`` (the refills' kNN), ``routing`` (their regions added to the
        #: routing table), ``short`` (a batch sent again, :meth:`settle`).
        self.refill_parts_ms: dict[str, float] = {}
        #: Each worker's announced refill deadlines (:class:`DueTable`).
        self.due = [DueTable() for _ in range(pool.size)]
        #: Lists refilled only when a worker returned them short (:meth:`settle`).
        self.short_refills = 0
        self._settled: list[list[Pending[WorkerReport]]] = []  # the last call lists settled
        self._late: dict[int, tuple[float, float]] = {}  # batch -> workers' (wall s, CPU s) in settle's calls
        self._last: DispatchedBatch | None = None  # with a window: the last batch sent

    def _expire(self, batch: pa.Table) -> tuple[pa.Table, int, int, dict[int, Refills], float]:
        """Move the watermark with ``batch``; drop its late objects; expire the store; refill the
        lists the workers announced due by the new cutoff (module docstring). Returns the live
        batch, late objects, cutoff, refills, ms spent."""
        t0 = time.perf_counter()
        t = batch.column("t").to_numpy()
        cutoff = self.window.advance(t)
        late = t <= cutoff
        n_late = int(late.sum())
        if n_late:
            batch = batch.filter(pa.array(~late))
        self.objects.expire(cutoff)
        self.seen.forget(cutoff)
        needs = [due.take(cutoff) for due in self.due]
        self.refill_parts_ms = {"expire": (time.perf_counter() - t0) * 1e3, "search": 0.0, "routing": 0.0}
        refills = self._refill(needs, route_now=False)  # merged into the table once the batch is sent
        return batch, n_late, cutoff, refills, (time.perf_counter() - t0) * 1e3

    def settle(self, d: DispatchedBatch) -> None:
        """Wait for ``d``'s workers (not their writes); learn their announced deadlines; send
        ``d`` again to each worker that returned lists short (:attr:`WorkerReport.short`), with
        their refills over the live objects but ``d``'s own and every object of ``d`` (the
        refills widen regions the batch was routed by). ``d.pending`` then holds the reports;
        a lost worker's call is left to fail in :meth:`collect`. Once per list of calls (a
        revival's replay of ``d`` has its own, and is checked too).

        Raises
        ------
        RuntimeError
            A worker returned lists short three times for one batch (its refills did not cover
            what its expiry asks for: a defect, never to be written over).
        """
        if d.cutoff is None or any(p is d.pending for p in self._settled):
            return
        self._settled.append(d.pending)
        del self._settled[:-8]
        out = self.pool.gather_each(d.pending)
        for i, r in enumerate(out):
            tries = 0
            while isinstance(r, WorkerReport) and r.short is not None:
                w, tries = r.worker, tries + 1
                if tries > 3:
                    raise RuntimeError(f"worker {w} returned batch {d.number} short three times: "
                                       f"{list(r.short.ids)[:5]}")
                t0 = time.perf_counter()  # (a short report announces nothing)
                refills = self._refill([QueryColumns.of([])] * w + [r.short], d.ids).get(w)
                self.short_refills += len(r.short.ids)
                call = self.pool.process(w, d.shared, np.arange(d.objects, dtype=np.int64), cutoff=d.cutoff,
                                         refills=refills)
                spent_ms = (time.perf_counter() - t0) * 1e3
                self.refill_parts_ms["short"] = self.refill_parts_ms.get("short", 0.0) + spent_ms
                first, r = r, self.pool.gather_each([call])[0]
                if isinstance(r, WorkerReport):  # (in process the call ran here, not in the dispatch)
                    late = self._late.get(d.number, (0.0, 0.0))
                    self._late[d.number] = (late[0] + r.busy_s, late[1] + r.cpu_s - r.redis_server_s)
                    r = replace(r, refilled=r.refilled + first.refilled, busy_s=r.busy_s + first.busy_s,
                                cpu_s=r.cpu_s + first.cpu_s)
                    d.pending[i] = Pending(w, self.pool.share(r))
                else:
                    d.pending[i] = call
            if isinstance(r, WorkerReport):
                self.due[r.worker].absorb(r.due)

    def _refill(self, needs: list[QueryColumns], exclude: frozenset[str] = frozenset(), *,
                route_now: bool = True) -> dict[int, Refills]:
        """Each worker's :class:`Refills`: one kNN search over the live objects for all (but
        ``exclude``: a batch in the store already, replayed to a revived worker). Their regions
        join the routing table (they route the batch), merged into its sorted entries now or,
        with ``route_now=False``, by :meth:`_merge_routing` once the batch is sent."""
        workers = np.concatenate([np.full(len(n.ids), w, dtype=np.int64) for w, n in enumerate(needs)])
        if not len(workers):
            return {}
        lon = np.concatenate([np.asarray(n.lon, dtype=np.float64) for n in needs])
        lat = np.concatenate([np.asarray(n.lat, dtype=np.float64) for n in needs])
        k = np.concatenate([np.asarray(n.k, dtype=np.int64) for n in needs])
        asked = QueryColumns([q for n in needs for q in n.ids], lon, lat, [kw for n in needs for kw in n.keywords], k)
        words = pa.array(asked.keywords, type=pa.list_(pa.string()))
        t0 = time.perf_counter()
        topk, info = self.objects.knn_v(lon, lat, words, k, exclude=exclude)
        t1 = time.perf_counter()
        rect = self.rects(lon, lat, topk.kth(k))
        self.routing.add_many(self.routing.codes_of(words), rect.x0, rect.y0, rect.x1, rect.y1, workers,
                              merge=route_now)
        self.refill_parts_ms.update(search=(t1 - t0) * 1e3, routing=(time.perf_counter() - t1) * 1e3)
        out = {}
        for w in np.unique(workers).tolist():
            sel = np.flatnonzero(workers == w)
            mine = topk.take(sel)
            held = np.zeros(len(info), dtype=bool)  # (its lists' rows renumbered into the details it is sent)
            held[mine.rows] = True
            mine = KnnColumns(mine.counts, mine.ids, mine.dist, (np.cumsum(held) - 1)[mine.rows])
            out[w] = Refills(asked.take(sel), mine, info.take(np.flatnonzero(held)))
        return out

    def _merge_routing(self) -> None:
        """Merge the refilled regions into the routing table's sorted entries (they route
        already: :meth:`LiveRouting.add_many` with ``merge=False``), timed into the batch's
        ``routing`` part; nothing without a window)."""
        if self.window is None:
            return
        t0 = time.perf_counter()
        self.routing.merge_pending()
        self.refill_parts_ms["routing"] = self.refill_parts_ms.get("routing", 0.0) + (time.perf_counter() - t0) * 1e3

    def refill_one(self, worker: int, needs: QueryColumns, exclude: frozenset[str]) -> Refills | None:
        """Worker ``worker``'s :class:`Refills` for ``needs`` over the live objects but ``exclude``
        (a revived worker replaying a batch the store holds already), their regions routed."""
        return self._refill([QueryColumns.of([])] * worker + [needs], exclude).get(worker)

    def admit(self, ids: Sequence[str], t: np.ndarray) -> Admission:
        """The rule for which of a batch's objects the runtime takes (``knnmon serve`` asks it once
        per read, rejects the others with their reasons and dispatches the rest as admitted; an
        unadmitted batch, ``knnmon run``'s, has :meth:`dispatch` drop the same ones, by
        :meth:`SeenIds.add_new` over the same :meth:`SeenIds.seen_v` and the window's cutoff): a
        **duplicate** was seen before or earlier in the batch (the first one counts); with a
        window, a **late** object (not a duplicate) has ``t <= `` the cutoff the batch's other
        objects move the watermark to. Changes nothing.

        Parameters
        ----------
        ids
            ``(n,)`` object ids.
        t
            ``(n,)`` int64 epoch ms.
        """
        dup = self.seen.seen_v(ids)
        late = np.zeros(len(dup), dtype=bool)
        cutoff = None
        if self.window is not None and not dup.all():
            t = np.asarray(t, dtype=np.int64)
            cutoff = self.window.cutoff_after(t[~dup])
            if cutoff is not None:
                late = ~dup & (t <= cutoff)
        return Admission(dup, late, cutoff)

    def drop_seen(self, batch: pa.Table, admitted: bool = False) -> tuple[pa.Table, int]:
        """``batch`` without the ids seen before (or twice in it; the first one counts), and how
        many were dropped; the rest are seen from now on. ``admitted``: :meth:`admit` said the
        batch holds none (nothing to check)."""
        t = batch.column("t").to_numpy() if self.window is not None else None
        if admitted:
            self.seen.add(batch.column("id").to_pylist(), t)
            return batch, 0
        fresh = self.seen.add_new(batch.column("id").to_pylist(), t)
        dup = int(len(fresh) - fresh.sum())
        return (batch.filter(pa.array(fresh)) if dup else batch), dup

    def _route(self, batch: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
        """A batch as the workers receive it (``id``, ``lon``, ``lat``, ``t``, ``keywords``), its
        (object, keyword code) pairs that some query has, ``(p,)`` int64 each, and each object's
        worker bitmask, ``(n,)`` uint64 (:meth:`LiveRouting.route_v`)."""
        lon, lat = batch.column("lon").to_numpy(), batch.column("lat").to_numpy()
        keywords = batch.column("keywords").combine_chunks()
        owner, codes = self.routing.encode(keywords)
        keep = codes >= 0
        pair_obj, pair_code = owner[keep], codes[keep]
        cells = self.routing.table.grid.cell_of(lon, lat)
        masks = self.routing.route_v(cells, pair_obj, pair_code)
        table = pa.table({"id": batch.column("id"), "lon": lon, "lat": lat, "t": batch.column("t").to_numpy(),
                          "keywords": keywords})
        return table, pair_obj, pair_code, masks

    def dispatch(self, batch: pa.Table, admitted: bool = False) -> DispatchedBatch:
        """Route ``batch`` (``id``, ``lon``, ``lat``, ``t``, ``keywords``) and send each worker
        its objects, without waiting. ``admitted``: :meth:`admit` took every object of the batch
        already (no duplicate to drop, none late)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        batch, dup = self.drop_seen(batch, admitted)
        n_late, cutoff, refills, refill_ms = 0, None, {}, 0.0
        if self.window is not None:
            if self._last is not None:  # (its deadlines, and no batch behind it if one goes again)
                self.settle(self._last)
            batch, n_late, cutoff, refills, refill_ms = self._expire(batch)
        table, pair_obj, pair_code, masks = self._route(batch)
        number = self.next_batch
        self.next_batch += 1
        # Each worker takes its rows from the masks in the shared batch: a call carrying its rows
        # costs the dispatch about twice the CPU of one carrying the batch's reference alone.
        routed = ObjectBatch(number, table, pair_obj, pair_code, masks)
        shared = self.pool.share(routed)
        pending, sent, rows = [], 0, {}
        try:
            for w in range(self.pool.size):
                mine = routed.rows_of(w)
                if len(mine) or cutoff is not None:
                    window = {"cutoff": cutoff, "refills": refills.get(w)} if cutoff is not None else {}
                    pending.append(self.pool.process(w, shared, None, **window))
                    sent += len(mine)
                    rows[w] = mine
        finally:
            self._merge_routing()  # while the workers work
        route_ms = (time.perf_counter() - t0) * 1e3
        route_cpu_ms = (time.thread_time() - c0) * 1e3  # not inflated by workers already running
        self.objects.append(batch)
        ids = frozenset(batch.column("id").to_pylist()) if cutoff is not None else frozenset()
        d = DispatchedBatch(number, batch.num_rows, dup, sent, pending, t0, route_ms, route_cpu_ms, shared, rows,
                            n_late, refill_ms, cutoff, ids)
        self._last = d if cutoff is not None else None
        return d

    def collect(self, d: DispatchedBatch) -> BatchReport:
        """Wait for a dispatched batch's workers and their writes; its :class:`BatchReport`.

        Raises
        ------
        WorkerLostError
            A worker of the batch died.
        StoreUnavailableError
            A worker's write failed after every retry.
        """
        self.settle(d)
        reports: list[WorkerReport] = self.pool.gather(d.pending)  # (none short: settle sent them again)
        route_ms, route_cpu_ms = d.route_ms, d.route_cpu_ms
        if self.pool.inline:  # the workers ran inside the dispatch: not routing (the write
            # thread's CPU joins the reports below, and was never the dispatching thread's)
            late_s, late_cpu_s = self._late.pop(d.number, (0.0, 0.0))
            route_cpu_ms -= (sum(r.cpu_s - r.redis_server_s for r in reports) - late_cpu_s) * 1e3
            route_ms -= (sum(r.busy_s for r in reports) - late_s) * 1e3
        queued = [i for i, r in enumerate(reports) if r.write_queued]
        if queued:  # the batch is done when its writes are in Redis
            writes = self.pool.gather([self.pool.written(reports[i].worker, d.number) for i in queued])
            for i, w in zip(queued, writes):
                reports[i] = reports[i].with_write(w)
        update_ms = (time.perf_counter() - d.t0) * 1e3
        return BatchReport.of(d.number, d.objects, d.duplicates, d.deliveries, self.pool.size, update_ms, route_ms,
                              route_cpu_ms, reports, late=d.late, refill_ms=d.refill_ms)

