"""The worker: owns a share of the queries and keeps their kNN exact as object batches arrive.

A plain class (unit-testable without a cluster); :mod:`knnmon.workers.actor` wraps it as a Ray
actor at the edge. :class:`KnnWorker` is a thin front: its state lives in
:mod:`~knnmon.workers.query_table`, :mod:`~knnmon.workers.topk_lists`,
:mod:`~knnmon.workers.object_handles` and :mod:`~knnmon.workers.vocabulary`; what it does per
batch in :mod:`~knnmon.workers.batch_update` (``SPEC.md``, "The worker"; Tsuruoka et al. 2019,
§4.4) with the compiled :mod:`~knnmon.workers.kernels`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from knnmon.connection import set_retry_window
from knnmon.heap import resident_bytes
from knnmon.query import QueryColumns
from knnmon.reports import WorkerStats, WriteFigures
from knnmon.workers import grid_runs, kernels
from knnmon.workers.batch_update import BatchUpdate, Merge
from knnmon.workers.handover import Handover
from knnmon.workers.held_texts import HeldTexts
from knnmon.workers.holders import Details, Texts
from knnmon.workers.kept_state import KeptState
from knnmon.workers.keyword_lists import KeywordLists
from knnmon.workers.object_handles import NO_TIME, ObjectHandles
from knnmon.workers.query_index import QueryIndex
from knnmon.workers.query_load import QueryLoad
from knnmon.workers.query_table import QueryTable
from knnmon.workers.registration import Registration
from knnmon.workers.release_parts import ReleaseInParts, sjf_groups
from knnmon.workers.settings import MAX_RELEASE_GROUPS, WorkerSettings
from knnmon.workers.result_writer import ResultWriter
from knnmon.workers.rtree_index import RTreeIndex
from knnmon.workers.topk_lists import TopKLists
from knnmon.workers.vocabulary import Vocabulary
from knnmon.workers.window_lists import WindowLists
from knnmon.workers.write_queue import WriteQueue

__all__ = ["INDEXES", "MAX_RELEASE_GROUPS", "NO_TIME", "KnnWorker", "Merge", "sjf_groups"]

#: Query-region index by name: knnmon's keyword-aware grid, the keyword-aware R-tree with
#: BatchSearch (Wang, Zhang, Kitsuregawa), or the single-process reference's keyword lists.
INDEXES = {"grid": QueryIndex, "rtree": RTreeIndex, "keyword-lists": KeywordLists}


def _mb(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def _warm_up() -> None:
    """Load pyarrow's compute kernels and compile (or load) the worker's numba kernels now: in a
    fresh worker process their first use costs ~0.2-0.6 s, which would otherwise land on the
    first batch's update time."""
    import pyarrow as pa

    kernels.compile_kernels()
    grid_runs.compile_kernels()
    t = pa.table({"id": ["a"], "keywords": [["b"]]})
    t.take(np.array([0])).column("keywords").to_pylist()


class KnnWorker(Registration, BatchUpdate, WindowLists, ReleaseInParts, Handover, KeptState):
    """Exact kNN maintenance for a set of queries: a front over the worker's rooms.

    State: the queries as columns (:class:`~knnmon.workers.query_table.QueryTable`, ``queries``),
    their top-k lists in flat arrays (:class:`~knnmon.workers.topk_lists.TopKLists`, ``lists``:
    memory follows the sum of the queries' ``k``), the objects the lists hold by handle
    (:class:`~knnmon.workers.object_handles.ObjectHandles`, ``handles``), the keyword codes
    (:class:`~knnmon.workers.vocabulary.Vocabulary`, ``vocabulary``) and the query index
    (``index``). Behaviour: registration (:mod:`~knnmon.workers.registration`), a batch
    (:mod:`~knnmon.workers.batch_update`, its hot steps compiled in
    :mod:`~knnmon.workers.kernels`), the window (:mod:`~knnmon.workers.window_lists`), release in
    parts (:mod:`~knnmon.workers.release_parts`), re-balancing (:mod:`~knnmon.workers.handover`) and
    a kept start (:mod:`~knnmon.workers.kept_state`).
    Unregistered queries' places, and handles no result holds any more, are released by
    :meth:`compact` once they are half of what is held.

    Parameters
    ----------
    worker_id
        This worker's number (written to ``knn:query:{qid}`` as ``worker``).
    settings
        :class:`~knnmon.workers.settings.WorkerSettings` (the same for every worker of a run).
    """

    def __init__(self, worker_id: int, settings: WorkerSettings = WorkerSettings()) -> None:
        if settings.redis_wait_s is not None:
            set_retry_window(settings.redis_wait_s)
        self.settings = settings
        self.release_groups = settings.release_groups
        self.worker_id, self.reserve = worker_id, settings.reserve
        self.writer = ResultWriter(settings.redis_url, settings.namespace, worker_id) if settings.redis_url else None
        self.queue = WriteQueue(self.writer) if self.writer is not None and settings.overlap_writes else None
        self.holders = self.writer.holders() if self.writer is not None else None  # of the written results
        self.queries = QueryTable()
        self.lists = TopKLists()
        self.handles = ObjectHandles()
        self.vocabulary = Vocabulary()  # (each load, registration and hand-over brings its queries' codes)
        self.index = INDEXES[settings.index]()
        self.load = QueryLoad()  # each query's recent measured load (re-balancing reads it)
        self.track_load = settings.track_load
        self._before: tuple[np.ndarray, np.ndarray] | None = None  # (slot, handle) results before an expiry
        self._cutoff = np.iinfo(np.int64).min  # the last expiry's cutoff
        self._needs = np.empty(0, dtype=np.int64)  # slots an expiry asked to refill, until the refills come
        self._refilled: dict[str, str] = {}  # details (text) of the objects a refill brought in
        self._details = HeldTexts(self.handles) if settings.reserve else None  # details (text) of every object held
        self.expired = self.refills = 0
        self._handed: list[tuple[str, list[str]]] = []  # (query, members) exported, not yet released
        self._tag = 0
        self._version = 0  # the change feed version of the batch being processed
        self.refreshed = 0
        self.handle_compactions = 0  # (counted by :meth:`_compact_handles`)
        _warm_up()

    # -- the query index -------------------------------------------------------------------------
    def rebuild_index(self) -> float:
        """Rebuild the query index from the current radii; returns seconds spent."""
        t0 = time.perf_counter()
        q = self.queries
        slot, code = q.entries(np.flatnonzero(q.alive))
        self.index.rebuild(slot, code, q.lon[slot], q.lat[slot], q.radius[slot])
        return time.perf_counter() - t0

    def _refresh(self, slots: np.ndarray) -> None:
        """Re-index queries whose region changed (shrunk, new, removed)."""
        q = self.queries
        slots = np.asarray(slots, dtype=np.int64)
        slot, code = q.entries(slots[q.alive[slots]])
        self.index.refresh(slots, slot, code, q.lon[slot], q.lat[slot], q.radius[slot])
        self.refreshed += len(slots)

    # -- writes ----------------------------------------------------------------------------------
    def _write_now(self, fn, *args) -> Any:
        """Call a writer method now, after any batch writes still queued (in stream order)."""
        return self.queue.now(fn, *args) if self.queue is not None else fn(*args)

    def last_write(self) -> tuple[str | None, bool]:
        """:meth:`ResultWriter.last_write` (``(None, False)`` without Redis); after the writes
        still queued."""
        if self.writer is None:
            return None, False
        return self._write_now(self.writer.last_write)

    def written(self, batch: int) -> WriteFigures:
        """Wait until batch ``batch``'s changes are in Redis (with ``overlap_writes``); the
        write's figures (all 0 without ``overlap_writes`` or when the batch changed nothing).

        Raises
        ------
        StoreUnavailableError
            The write, or an earlier one, failed after every retry.
        """
        return self.queue.wait(batch) if self.queue is not None else WriteFigures()

    def _held(self, e_slot: np.ndarray, e_h: np.ndarray, l_slot: np.ndarray, l_h: np.ndarray,
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

    def _results_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The results of ``slots`` (``(m,)`` int64) as written: ``(slot, handle, distance)``
        of each member, ``(e,)`` int64, int64, float64 meters, in slot order, nearest first."""
        n = np.minimum(self.lists.count[slots], self.queries.k[slots])
        at = self.lists.places(slots, n)
        return np.repeat(slots, n), self.lists.h[at], self.lists.d[at]

    def _next_tag(self) -> int:
        self._tag -= 1  # initial loads and registrations use negative tags, batches their number
        return self._tag

    # -- results ---------------------------------------------------------------------------------
    def _result(self, slot: int) -> list[tuple[str, float]]:
        """The row as stored: nearest first, ties at equal distance in any order (Redis orders a
        sorted set's ties by member itself, so the writes need no sort)."""
        h, d = self.lists.row(slot, int(min(self.lists.count[slot], self.queries.k[slot])))
        return list(zip(self.handles.names(h), d))

    def result(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` by (distance, id)."""
        slot = self.queries.slot(qid)
        if slot is None:
            raise KeyError(qid)
        return sorted(self._result(slot), key=lambda e: (e[1], e[0]))

    def regions(self) -> tuple[QueryColumns, np.ndarray]:
        """The registered queries and their kNN radii ``r_q`` (``(m,)`` float64 meters, ``inf``
        below ``k`` results): what the routing table must cover for this worker."""
        live = np.flatnonzero(self.queries.alive)
        return self.queries.columns(live), self.queries.radius[live].copy()

    def stats(self) -> WorkerStats:
        """This worker's :class:`~knnmon.reports.WorkerStats`: queries held, index entries, queries
        re-indexed so far, list entries expired and results refilled so far (a window), this
        process's peak and current RSS and its current anonymous RSS (MB; the current ones
        ``None`` where there is no ``/proc``: :func:`~knnmon.heap.resident_bytes`), its process
        id, and the Ray node it runs on (``None`` outside Ray)."""
        import resource

        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return WorkerStats(worker=self.worker_id, node=node, pid=os.getpid(), queries=int(self.queries.alive.sum()),
                           expired=self.expired, refilled=self.refills, index_entries=self.index.entries,
                           refreshed=self.refreshed, keywords=len(self.vocabulary),
                           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                           rss_mb=_mb(resident_bytes()), rss_anon_mb=_mb(resident_bytes("RssAnon")))
