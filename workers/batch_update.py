"""A worker's batch: candidates from the query index, the compiled merge into the top-k lists,
the changes to write, and ``r_q`` shrinking (``docs/concepts.md``, "The worker"; Tsuruoka et al. 2019,
§4.4):

1. candidates: (object, query) pairs whose query region holds the object and shares a keyword,
   from the worker's index (vectorised, no loop over objects), those that fail the chord pre-test
   left out (the grid index tests them as it finds them: most fail, never written out);
2. the exact haversine check against ``r_q`` (queries with fewer than ``k`` results pass always)
   and the top-k merge ordered by ``(distance m, object id)``, in :mod:`~knnmon.workers.kernels`;
3. ``r_q`` shrinks to the k-th distance and the query is re-indexed with its smaller region
   (:meth:`QueryIndex.refresh`, into a small delta run, no re-sort);
4. every changed result, the objects now in results, and one ``changes`` entry per changed
   query (:class:`~knnmon.batch.BatchChanges`) written in one atomic, exactly-once script call
   (:class:`~knnmon.workers.result_writer.ResultWriter`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from knnmon.batch import BatchChanges, ObjectBatch, ObjectColumns
from knnmon.encoding import id_prefix_keys
from knnmon.geo import haversine_m
from knnmon.refills import NEVER, Refills
from knnmon.reports import WorkerReport
from knnmon.workers import kernels
from knnmon.workers.query_index import pretested
from knnmon.workers.state import WorkerState
from knnmon.workers.window_lists import NO_CUTOFF, WindowLists

__all__ = ["BatchUpdate", "Merge", "pairs_of_rows"]


def pairs_of_rows(batch: ObjectBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (object, keyword code) pairs of a shared batch's rows ``rows`` (``(m,)`` int64), the
    objects renumbered as positions in ``rows``: ``(p,)`` int64 each."""
    remap = np.full(batch.table.num_rows, -1, dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    sel = remap[batch.pair_obj] >= 0
    return remap[batch.pair_obj[sel]], batch.pair_code[sel]


@dataclass
class Merge:
    """What merging a batch's pairs changed (:meth:`BatchUpdate._update`). Arrays ``(x,)``;
    entered and left entries grouped by slot in slot order.

    ``passed``: pairs within ``r_q``; ``changed``: sorted slots whose kept list gained an entry
    (without a reserve, whose result changed); ``in_result``: sorted slots a new entry entered
    the result (the first ``k``) of; entered ``e_slot``, ``e_obj`` (batch position), ``e_d``
    (meters), ``e_place`` (its place in the flat lists), ``e_h`` (its handle); left ``l_slot``,
    ``l_h``; ``b_slot``, ``b_h``: the changed lists' results before the merge;
    ``entered_obj``, ``entered_h``: the sorted batch positions of the objects that entered, and
    their handles.
    """

    ARRAYS: ClassVar[tuple[str, ...]] = ("changed", "in_result", "e_slot", "e_obj", "e_d", "e_place", "l_slot",
                                          "l_h", "b_slot", "b_h")

    passed: int
    changed: np.ndarray
    in_result: np.ndarray
    e_slot: np.ndarray
    e_obj: np.ndarray
    e_d: np.ndarray
    e_place: np.ndarray
    l_slot: np.ndarray
    l_h: np.ndarray
    b_slot: np.ndarray
    b_h: np.ndarray
    e_h: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    entered_obj: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    entered_h: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def before(self) -> tuple[np.ndarray, np.ndarray]:
        return self.b_slot, self.b_h

    def plus(self, other: Merge) -> Merge:
        """Both merges' entries (of disjoint slots), regrouped in slot order."""
        def cat(names: tuple[str, ...], key: str) -> list[np.ndarray]:
            arrays = [np.concatenate([getattr(self, n), getattr(other, n)]) for n in names]
            order = np.argsort(arrays[names.index(key)], kind="stable")
            return [a[order] for a in arrays]

        e = cat(("e_slot", "e_obj", "e_d", "e_place"), "e_slot")
        lv = cat(("l_slot", "l_h"), "l_slot")
        b = cat(("b_slot", "b_h"), "b_slot")
        return Merge(self.passed + other.passed, np.union1d(self.changed, other.changed),
                     np.union1d(self.in_result, other.in_result), *e, *lv, *b)


class BatchUpdate:
    """The batch part of a :class:`~knnmon.workers.worker.KnnWorker` (module docstring), over its
    :class:`~knnmon.workers.state.WorkerState`; the ``window`` expires and refills before a
    batch's objects and diffs the results it touched."""

    def __init__(self, state: WorkerState, window: WindowLists) -> None:
        self.state, self.window = state, window

    def process_batch(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                      keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None = None, *,
                      cutoff: int | None = None, refills: Refills | None = None) -> WorkerReport:
        """Update every affected kNN for a batch of objects and write the changes to Redis.

        Parameters
        ----------
        batch
            The batch number (``>= 0``; the idempotency tag of the Redis transaction).
        ids, lon, lat, t, keywords
            ``n`` objects: string ids, degrees, epoch ms, normalised keywords. Ids must be new
            (the coordinator drops duplicates).
        pairs
            Optional ``(object index, keyword code)`` int64 arrays, pre-encoded with the shared
            vocabulary (else :meth:`Vocabulary.encode` computes them).
        cutoff
            With a window: the batch's expiry cutoff (:meth:`expire`, if not called already).
        refills
            With a window: the exact kNN over the live objects (before this batch) of the queries
            :meth:`expire` asked to refill, applied before the batch's objects.

        Returns
        -------
        WorkerReport
            With ``overlap_writes`` and a changed result, the write is queued
            (``write_queued``) and its figures come from :meth:`written`.
        """
        t0, c0 = time.perf_counter(), time.thread_time()
        merges0, handles0 = self.state.index.compactions, self.state.handle_compactions
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        t = np.asarray(t, dtype=np.int64)
        self.state.version = batch + 1  # the change feed's version of this batch's changes
        if self.state.settings.track_load:
            self.state.load.tick()
        if cutoff is not None:
            self.window.expire(cutoff)
        refilled = self.window.refill(refills) if refills is not None else np.empty(0, np.int64)
        n_refilled = len(refills.qids) if refills is not None else 0
        short = self.window.unmet(refilled)
        if len(short):  # not applied: sent again with these refills (knnmon.workers.window_lists)
            self.window.needs = short
            self.window.announced[:] = NEVER  # (the coordinator missed announcements: all again)
            q = self.state.queries
            return WorkerReport(worker=self.state.worker_id, batch=batch, busy_s=time.perf_counter() - t0,
                                cpu_s=time.thread_time() - c0, refilled=n_refilled, short=q.columns(short, q.cap))
        self.window.needs = np.empty(0, dtype=np.int64)
        obj = slot = np.empty(0, dtype=np.int64)
        found = 0
        if len(ids):
            po, pc_ = pairs if pairs is not None else self.state.vocabulary.encode(keywords)
            # Pre-tested as found, unless the load charges every pair found (re-balancing).
            reach = None if self.state.settings.track_load else self.state.queries.reach
            obj, slot = self.state.index.candidates(lon, lat, po, pc_, reach)
            found = self.state.index.found
        m, changed, changes, written = self.apply(ids, lon, lat, t, keywords, obj, slot)
        busy_core = time.perf_counter() - t0
        t1 = time.perf_counter()
        server_s = 0.0
        if len(written) and self.state.writer is not None:
            if self.state.queue is not None:
                self.state.queue.submit_batch(batch, changes)
            else:
                server_s = self.state.writer.write_batch(batch, changes)
        redis_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        if len(changed):
            self.state.shrink(changed)
        self.state.release_handles()
        due = None
        if self.window.cutoff > NO_CUTOFF:  # windowed: their deadlines and oldest times anew
            self.window.touched.append(changed)
        if cutoff is not None:
            due = self.window.announce()
        index_s = time.perf_counter() - t2
        return WorkerReport(worker=self.state.worker_id, batch=batch, objects=len(ids), candidates=found,
                            passed=m.passed if m is not None else 0, changed=len(written),
                            busy_s=busy_core + redis_s + index_s, cpu_s=time.thread_time() - c0 + server_s,
                            redis_s=redis_s, redis_server_s=server_s, index_s=index_s,
                            write_queued=self.state.queue is not None and bool(len(written)), refilled=n_refilled,
                            index_merges=self.state.index.compactions - merges0,
                            handle_compactions=self.state.handle_compactions - handles0, due=due)

    def process_rows(self, batch: ObjectBatch, rows: np.ndarray | None = None, *, cutoff: int | None = None,
                     refills: Refills | None = None) -> WorkerReport:
        """:meth:`process_batch` for the rows ``rows`` (``(m,)`` int64: this worker's objects)
        of a batch that every worker shares; selecting them is part of this worker's work.
        ``rows=None``: the rows whose worker bitmask has this worker's bit
        (:meth:`ObjectBatch.rows_of`; the call then carries no array). ``cutoff`` and
        ``refills`` as in :meth:`process_batch`."""
        t0, c0 = time.perf_counter(), time.thread_time()
        table = batch.table
        rows = batch.rows_of(self.state.worker_id) if rows is None else np.asarray(rows, dtype=np.int64)
        part = table.take(rows)
        args = (batch.number, part.column("id").to_pylist(), part.column("lon").to_numpy(),
                part.column("lat").to_numpy(), part.column("t").to_numpy(), part.column("keywords").to_pylist(),
                pairs_of_rows(batch, rows))
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        report = self.process_batch(*args, cutoff=cutoff, refills=refills)
        return replace(report, busy_s=report.busy_s + wall, cpu_s=report.cpu_s + cpu)


    def apply(self, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
              keywords: Sequence[Sequence[str]], obj: np.ndarray, slot: np.ndarray
              ) -> tuple[Merge | None, np.ndarray, BatchChanges | None, np.ndarray]:
        """One batch (or one part of it): merge the candidate pairs ``(obj, slot)`` (:meth:`_update`),
        keep the entered objects' details (a reserve), charge the load, and build the changes
        to write: ``(merge, changed slots, changes or None, written slots)``. With an expiry not
        yet written or a reserve, the changed results are diffed whole (:meth:`_window_changes`)."""
        m = self._update(ids, t, lon, lat, obj, slot)
        changed = m.changed if m is not None else np.empty(0, dtype=np.int64)
        batch = ObjectColumns(ids, lon, lat, t, keywords)
        if m is not None and self.state.details is not None:
            entered = [ids[j] for j in m.entered_obj.tolist()]
            self.state.details.keep(m.entered_h, batch.texts(entered))
        if self.state.settings.track_load:
            self.state.load.charge(obj, slot, changed)
        changes, written = None, changed
        if self.window.before is not None or (m is not None and self.state.settings.reserve):
            changes, written = self.window.changes(batch, m)
        elif len(changed) and self.state.writer is not None:
            changes = self.state.batch_changes(m.changed, m.e_slot, m.e_h, m.e_d, m.l_slot, m.l_h, batch.texts)
        return m, changed, changes, written

    def _update(self, ids: Sequence[str], times: np.ndarray, lon: np.ndarray, lat: np.ndarray, obj: np.ndarray,
                slot: np.ndarray) -> Merge | None:
        """Merge a batch's candidate pairs ``(obj, slot)`` (``(c,)`` int64 each, from the query
        index) into the touched queries' top-k lists: the chord pre-test (when the index did not
        apply it: re-balancing charges every pair), the haversine distance and the merge with
        ties by id, in :mod:`~knnmon.workers.kernels`; then handles for the objects that entered.
        ``None`` if no pair lies within its ``r_q``."""
        if not len(obj):
            return None
        q, L = self.state.queries, self.state.lists
        if self.state.settings.track_load:  # (else the index returned only pairs that pass it)
            obj, slot = pretested(lon, lat, obj, slot, q.reach)
        d = haversine_m(lon[obj], lat[obj], q.lon[slot], q.lat[slot])
        within = np.unique(obj[d <= q.radius[slot]])
        if not len(within):
            return None
        okey = np.zeros(len(lon), dtype=np.uint64)
        okey[within] = id_prefix_keys([ids[j] for j in within.tolist()])
        (passed, changed, in_result, e_slot, e_obj, e_d, e_place, l_slot, l_h, b_slot, b_h, fallback, f_slot, f_obj,
         f_d) = kernels.merge_topk(obj, slot, d, okey, q.radius, q.k, q.cap, L.ptr, L.count, L.d, L.h,
                                   self.state.handles.key, len(lon))
        m = Merge(int(passed[0]), changed, in_result, e_slot, e_obj, e_d, e_place, l_slot, l_h, b_slot, b_h)
        if len(fallback):
            m = m.plus(self._merge_by_ids(ids, fallback, f_slot, f_obj, f_d))
        uniq = np.unique(m.e_obj)
        handles = self.state.handles.handles_of([ids[j] for j in uniq.tolist()], times[uniq], okey[uniq])
        m.e_h = handles[np.searchsorted(uniq, m.e_obj)]
        m.entered_obj, m.entered_h = uniq, handles
        L.h[m.e_place] = m.e_h
        self.state.handles.key_new()
        return m

    def _merge_by_ids(self, ids: Sequence[str], slots: np.ndarray, f_slot: np.ndarray, f_obj: np.ndarray,
                      f_d: np.ndarray) -> Merge:
        """:func:`~knnmon.workers.kernels.merge_topk` for the queries it left to the ids
        themselves (entries at equal distance sharing an 8-byte id prefix across the ``k``-th or
        last place): each list and its new pairs sorted by (distance, id) in Python."""
        q, L = self.state.queries, self.state.lists
        out: dict[str, list] = {name: [] for name in Merge.ARRAYS}
        for s in slots.tolist():
            a, c, kk, cp = int(L.ptr[s]), int(L.count[s]), int(q.k[s]), int(q.cap[s])
            mine = f_slot == s
            held = L.h[a:a + c]
            merged = sorted([(d, oid, h) for d, oid, h in zip(L.d[a:a + c].tolist(), self.state.handles.names(held),
                                                              held.tolist())]
                            + [(d, ids[o], -1 - o) for d, o in zip(f_d[mine].tolist(), f_obj[mine].tolist())])
            kept = merged[:cp]
            new_at = [i for i, e in enumerate(kept) if e[2] < 0]
            if not new_at:
                continue
            out["changed"].append(s)
            if new_at[0] < kk:
                out["in_result"].append(s)
            out["b_slot"] += [s] * min(c, kk)
            out["b_h"] += L.h[a:a + min(c, kk)].tolist()
            for i in new_at:
                out["e_slot"].append(s)
                out["e_obj"].append(-1 - kept[i][2])
                out["e_d"].append(kept[i][0])
                out["e_place"].append(a + i)
            for d, _, h in merged[cp:]:
                if h >= 0:
                    out["l_slot"].append(s)
                    out["l_h"].append(h)
            L.d[a:a + len(kept)] = [e[0] for e in kept]
            L.h[a:a + len(kept)] = [e[2] for e in kept]
            L.count[s] = len(kept)
        return Merge(0, **{name: np.asarray(v, dtype=np.float64 if name == "e_d" else np.int64)
                           for name, v in out.items()})
