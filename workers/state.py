"""A worker's state: its queries, their top-k lists, the objects they hold, the keyword codes, the
query index and the writes to Redis. Every part of :class:`~knnmon.workers.worker.KnnWorker`
(registration, the batch, the window, hand-over, kept start) is given the one
:class:`WorkerState` it works on when it is built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from knnmon.batch import BatchChanges
from knnmon.connection import set_retry_window
from knnmon.reports import WriteFigures
from knnmon.workers.held_texts import HeldTexts
from knnmon.workers.holders import Details, Texts
from knnmon.workers.keyword_lists import KeywordLists
from knnmon.workers.object_handles import ObjectHandles
from knnmon.workers.query_index import QueryIndex
from knnmon.workers.query_load import QueryLoad
from knnmon.workers.query_table import QueryTable
from knnmon.workers.result_writer import ResultWriter
from knnmon.workers.rtree_index import RTreeIndex
from knnmon.workers.settings import WorkerSettings
from knnmon.workers.topk_lists import TopKLists
from knnmon.workers.vocabulary import Vocabulary
from knnmon.workers.write_queue import WriteQueue

__all__ = ["COMPACT_MIN", "HANDLES_SLACK", "INDEXES", "WorkerState"]

#: Query-region index by name: knnmon's keyword-aware grid, the keyword-aware R-tree, or the
#: single-process reference's keyword lists.
INDEXES = {"grid": QueryIndex, "rtree": RTreeIndex, "keyword-lists": KeywordLists}

#: Compaction (:meth:`~knnmon.workers.registration.Registration.compact`) waits for at least this
#: many places or handles to release.
COMPACT_MIN = 1 << 16
#: The handles are compacted once they outnumber those kept at the last compaction by this
#: factor: the details of objects that left every result (with a window, every expired one)
#: stay until then, so a worker's memory swings by this share of its objects' part.
HANDLES_SLACK = 1.25

T = TypeVar("T")


class WorkerState:
    """What a worker holds, and the steps every part of it shares.

    Rooms: the queries as columns (:class:`~knnmon.workers.query_table.QueryTable`, ``queries``),
    their top-k lists in flat arrays (:class:`~knnmon.workers.topk_lists.TopKLists`, ``lists``:
    memory follows the sum of the queries' ``k`` + reserve), the objects the lists hold by handle
    (:class:`~knnmon.workers.object_handles.ObjectHandles`, ``handles``), the keyword codes
    (:class:`~knnmon.workers.vocabulary.Vocabulary`, ``vocabulary``), the query index (``index``,
    one of :data:`INDEXES`), each query's measured load (``load``), with a reserve the details of
    every object held (``details``), and the writer to Redis with its queue and holder counts
    (``writer``, ``queue``, ``holders``; ``None`` without Redis).

    Parameters
    ----------
    worker_id
        This worker's number (written to ``knn:query:{qid}`` as ``worker``).
    settings
        :class:`~knnmon.workers.settings.WorkerSettings`.
    """

    def __init__(self, worker_id: int, settings: WorkerSettings) -> None:
        if settings.redis_wait_s is not None:
            set_retry_window(settings.redis_wait_s)
        self.worker_id, self.settings = worker_id, settings
        self.writer = ResultWriter(settings.redis_url, settings.namespace, worker_id) if settings.redis_url else None
        self.queue = WriteQueue(self.writer) if self.writer is not None and settings.overlap_writes else None
        self.holders = self.writer.holders() if self.writer is not None else None  # of the written results
        self.queries = QueryTable()
        self.lists = TopKLists()
        self.handles = ObjectHandles()
        self.vocabulary = Vocabulary()  # (each load, registration and hand-over brings its queries' codes)
        self.index = INDEXES[settings.index]()
        self.load = QueryLoad()  # each query's recent measured load (re-balancing reads it)
        self.details = HeldTexts(self.handles) if settings.reserve else None  # details (text) of every object held
        self.version = 0  # the change feed version of the batch being processed
        self.refreshed = self.handle_compactions = 0
        self._tag = 0

    # -- the query index -------------------------------------------------------------------------
    def rebuild_index(self) -> float:
        """Rebuild the query index from the current radii; returns seconds spent."""
        t0 = time.perf_counter()
        q = self.queries
        slot, code = q.entries(np.flatnonzero(q.alive))
        self.index.rebuild(slot, code, q.lon[slot], q.lat[slot], q.radius[slot])
        return time.perf_counter() - t0

    def refresh(self, slots: np.ndarray) -> None:
        """Re-index the queries of ``slots`` (``(m,)`` int64) whose region changed (shrunk, new,
        removed)."""
        q = self.queries
        slots = np.asarray(slots, dtype=np.int64)
        slot, code = q.entries(slots[q.alive[slots]])
        self.index.refresh(slots, slot, code, q.lon[slot], q.lat[slot], q.radius[slot])
        self.refreshed += len(slots)

    def shrink(self, changed: np.ndarray) -> None:
        """Shrink the kNN radius ``r_q`` of the ``changed`` slots whose list is full to its
        k-th (last kept) distance, and re-index them."""
        q, L = self.queries, self.lists
        kth = L.d[L.ptr[changed] + q.cap[changed] - 1]  # inf unless the list is full
        shrink = kth < q.radius[changed]
        slots = changed[shrink]
        if len(slots):
            q.set_radius(slots, kth[shrink])
            self.refresh(slots)

    # -- handles ---------------------------------------------------------------------------------
    def compact_handles(self) -> None:
        """Drop the handles of objects no list holds and no written result holds (renumbering
        the others). O(sum of k + handles)."""
        self.handle_compactions += 1
        mark = np.zeros(len(self.handles), dtype=bool)  # (a mark per handle: no sort, no hash)
        mark[self.lists.h[self.lists.h >= 0]] = True
        if self.holders is not None:  # (a query handed over holds its objects until it is released)
            mark[np.asarray(self.holders.held(), dtype=np.int64)] = True
        used = np.flatnonzero(mark)
        self.lists.renumber(self.handles.compact(used))
        if self.details is not None:
            self.details.renumber(used)
        if self.holders is not None:
            self.holders.renumber(used)

    def compact_due(self) -> bool:
        """Whether the places dropped queries left are at least :data:`COMPACT_MIN` and half of
        all places (:meth:`~knnmon.workers.registration.Registration.compact` is then due)."""
        return self.lists.released > max(COMPACT_MIN, len(self.lists.d) // 2)

    def release_handles(self) -> None:
        """Compact the handles once they outnumber those kept at the last compaction by
        :data:`HANDLES_SLACK` (and at least :data:`COMPACT_MIN` of them)."""
        if len(self.handles) > max(COMPACT_MIN, HANDLES_SLACK * self.handles.live):
            self.compact_handles()

    # -- writes ----------------------------------------------------------------------------------
    def write_now(self, fn: Callable[..., T], *args) -> T:
        """Call a writer method now, after any batch writes still queued (in stream order)."""
        return self.queue.now(fn, *args) if self.queue is not None else fn(*args)

    def last_write(self) -> tuple[str | None, bool]:
        """:meth:`ResultWriter.last_write` (``(None, False)`` without Redis); after the writes
        still queued."""
        if self.writer is None:
            return None, False
        return self.write_now(self.writer.last_write)

    def written(self, batch: int) -> WriteFigures:
        """Wait until batch ``batch``'s changes are in Redis (with ``overlap_writes``); the
        write's figures (all 0 without ``overlap_writes`` or when the batch changed nothing).

        Raises
        ------
        StoreUnavailableError
            The write, or an earlier one, failed after every retry.
        """
        return self.queue.wait(batch) if self.queue is not None else WriteFigures()

    def next_tag(self) -> int:
        """The idempotency tag of a write outside a batch: initial loads and registrations use
        negative tags, batches their number."""
        self._tag -= 1
        return self._tag

    def held(self, e_slot: np.ndarray, e_h: np.ndarray, l_slot: np.ndarray, l_h: np.ndarray,
             texts: Texts, qids: Sequence[str] | None = None) -> Details | None:
        """Count one write's holders (:mod:`knnmon.workers.holders`): handles ``e_h`` entered
        the results of slots ``e_slot``, ``l_h`` left those of ``l_slot`` (``(x,)`` int64 each;
        with ``qids``, positions in it instead of slots); ``texts``: the entered objects'
        details (:func:`~knnmon.workers.holders.texts_of`). The write's
        :attr:`~knnmon.batch.BatchChanges.details`; ``None`` without Redis."""
        if self.holders is None:
            return None
        e_slot, l_slot = np.asarray(e_slot, dtype=np.int64), np.asarray(l_slot, dtype=np.int64)
        if self.holders.single:
            e_b, l_b = np.zeros(len(e_h), dtype=np.int64), np.zeros(len(l_h), dtype=np.int64)
        else:
            slots = np.union1d(e_slot, l_slot)
            b = self.holders.buckets(self.queries.ids.names(slots) if qids is None else
                                     [qids[s] for s in slots.tolist()])
            e_b, l_b = b[np.searchsorted(slots, e_slot)], b[np.searchsorted(slots, l_slot)]
        return self.holders.change(e_h, e_b, l_h, l_b, self.handles.names, texts)

    def batch_changes(self, changed: np.ndarray, e_slot: np.ndarray, e_h: np.ndarray, e_d: np.ndarray,
                      l_slot: np.ndarray, l_h: np.ndarray, texts: Texts) -> BatchChanges:
        """:class:`BatchChanges` of the results ``changed`` (sorted slots): handles ``e_h`` (at
        ``e_d`` meters) entered and ``l_h`` left them, each grouped by their slot (``e_slot``,
        ``l_slot``) in slot order; ``texts``: the entered objects' details. Fresh lists, so a
        queued write may use them while the next batch runs. The holders are counted here, in
        the batch's order (:meth:`held`)."""
        names = self.handles.names
        details = self.held(e_slot, e_h, l_slot, l_h, texts)
        return BatchChanges(
            qids=self.queries.ids.names(changed),
            n_entered=np.bincount(np.searchsorted(changed, e_slot), minlength=len(changed)).tolist(),
            entered=names(e_h), distances=e_d.tolist(),
            n_left=np.bincount(np.searchsorted(changed, l_slot), minlength=len(changed)).tolist(),
            left=names(l_h), version=self.version, details=details)

    # -- results ---------------------------------------------------------------------------------
    def results_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The results of ``slots`` (``(m,)`` int64) as written: ``(slot, handle, distance)``
        of each member, ``(e,)`` int64, int64, float64 meters, in slot order, nearest first."""
        n = np.minimum(self.lists.count[slots], self.queries.k[slots])
        at = self.lists.places(slots, n)
        return np.repeat(slots, n), self.lists.h[at], self.lists.d[at]

    def result_row(self, slot: int) -> list[tuple[str, float]]:
        """The result of ``slot`` as stored: ``[(object id, distance m), ...]`` nearest first, ties
        at equal distance in any order (Redis orders a sorted set's ties by member itself, so the
        writes need no sort)."""
        h, d = self.lists.row(slot, int(min(self.lists.count[slot], self.queries.k[slot])))
        return list(zip(self.handles.names(h), d))
