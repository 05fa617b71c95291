"""The worker: owns a share of the queries and keeps their kNN exact as object batches arrive.

A plain class (unit-testable without a cluster); :mod:`knnmon.workers.actor` wraps it as a Ray
actor at the edge. :class:`KnnWorker` is a thin front built by composition: its state is one
:class:`~knnmon.workers.state.WorkerState`, and each of its parts is given that state when it is
built; what it does per batch is in :mod:`~knnmon.workers.batch_update` (``docs/concepts.md``, "The
worker"; Tsuruoka et al. 2019, §4.4) with the compiled :mod:`~knnmon.workers.kernels`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from knnmon.batch import ObjectBatch, ObjectInfo, QueryHandover
from knnmon.heap import resident_bytes
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.reports import KeptReport, LoadResult, WorkerReport, WorkerStats, WriteFigures
from knnmon.workers import grid_runs, kernels
from knnmon.workers.batch_update import BatchUpdate
from knnmon.workers.handover import Handover
from knnmon.workers.kept_state import KeptState
from knnmon.workers.registration import Registration
from knnmon.workers.settings import WorkerSettings
from knnmon.workers.state import WorkerState
from knnmon.workers.window_lists import WindowLists

__all__ = ["KnnWorker"]


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


class KnnWorker:
    """Exact kNN maintenance for a set of queries: the calls a worker answers
    (:class:`~knnmon.workers.interface.WorkerApi`), each passed to the part that does it.

    Built from parts that share one :class:`~knnmon.workers.state.WorkerState` (``state``: the
    queries, their top-k lists, the objects they hold, the keyword codes, the query index, the
    writes): registration (:class:`~knnmon.workers.registration.Registration`), a batch
    (:class:`~knnmon.workers.batch_update.BatchUpdate`, its hot steps compiled in
    :mod:`~knnmon.workers.kernels`), the window
    (:class:`~knnmon.workers.window_lists.WindowLists`), re-balancing
    (:class:`~knnmon.workers.handover.Handover`) and a kept start
    (:class:`~knnmon.workers.kept_state.KeptState`).

    Parameters
    ----------
    worker_id
        This worker's number (written to ``knn:query:{qid}`` as ``worker``).
    settings
        :class:`~knnmon.workers.settings.WorkerSettings` (the same for every worker of a run).
    """

    def __init__(self, worker_id: int, settings: WorkerSettings = WorkerSettings()) -> None:
        self.state = WorkerState(worker_id, settings)
        self.window = WindowLists(self.state)
        self.registration = Registration(self.state, self.window)
        self.update = BatchUpdate(self.state, self.window)
        self.handover = Handover(self.state, self.registration)
        self.kept = KeptState(self.state, self.handover, self.window)
        _warm_up()

    # -- batches (BatchUpdate, WindowLists) ------------------------------------------------------
    def process_rows(self, batch: ObjectBatch, rows: np.ndarray | None = None, *, cutoff: int | None = None,
                     refills: Refills | None = None) -> WorkerReport:
        """:meth:`BatchUpdate.process_rows`."""
        return self.update.process_rows(batch, rows, cutoff=cutoff, refills=refills)

    def process_batch(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                      keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None = None, *,
                      cutoff: int | None = None, refills: Refills | None = None) -> WorkerReport:
        """:meth:`BatchUpdate.process_batch`."""
        return self.update.process_batch(batch, ids, lon, lat, t, keywords, pairs, cutoff=cutoff, refills=refills)

    def expire(self, cutoff: int) -> QueryColumns:
        """:meth:`WindowLists.expire`."""
        return self.window.expire(cutoff)

    def written(self, batch: int) -> WriteFigures:
        """:meth:`WorkerState.written`."""
        return self.state.written(batch)

    def last_write(self) -> tuple[str | None, bool]:
        """:meth:`WorkerState.last_write`."""
        return self.state.last_write()

    # -- queries (Registration) ------------------------------------------------------------------
    def load_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                     objects: Mapping[str, ObjectInfo], **options: Any) -> LoadResult:
        """:meth:`Registration.load_queries`."""
        return self.registration.load_queries(queries, topk, objects, **options)

    def register_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                         objects: Mapping[str, ObjectInfo], vocabulary: Mapping[str, int] | None = None,
                         version: int = 0) -> None:
        """:meth:`Registration.register_queries`."""
        self.registration.register_queries(queries, topk, objects, vocabulary, version)

    def unregister_query(self, qid: str, version: int = 0) -> bool:
        """:meth:`Registration.unregister_query`."""
        return self.registration.unregister_query(qid, version)

    # -- re-balancing (Handover) -----------------------------------------------------------------
    def query_loads(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`Handover.query_loads`."""
        return self.handover.query_loads()

    def export_queries(self, qids: Sequence[str]) -> QueryHandover:
        """:meth:`Handover.export_queries`."""
        return self.handover.export_queries(qids)

    def export_parts(self, parts: Sequence[Sequence[str]]) -> tuple[QueryHandover, ...]:
        """:meth:`Handover.export_parts`."""
        return self.handover.export_parts(parts)

    def adopt_queries(self, handover: QueryHandover, vocabulary: Mapping[str, int] | None = None,
                      note: Mapping[str, str] | None = None) -> tuple[int, float]:
        """:meth:`Handover.adopt_queries`."""
        return self.handover.adopt_queries(handover, vocabulary, note)

    def release_handed(self) -> int:
        """:meth:`Handover.release_handed`."""
        return self.handover.release_handed()

    def regions_with(self, keywords: Sequence[str]) -> tuple[np.ndarray, ...]:
        """:meth:`Handover.regions_with`."""
        return self.handover.regions_with(keywords)

    # -- a kept start (KeptState) ----------------------------------------------------------------
    def kept_state(self) -> KeptReport:
        """:meth:`KeptState.kept_state`."""
        return self.kept.kept_state()

    def kept_queries(self) -> tuple[QueryColumns, np.ndarray, np.ndarray, dict[str, int]]:
        """:meth:`KeptState.kept_queries`."""
        return self.kept.kept_queries()

    def holds_among(self, oids: Sequence[str]) -> list[str]:
        """:meth:`KeptState.holds_among`."""
        return self.kept.holds_among(oids)

    def keep_for(self) -> int:
        """:meth:`KeptState.keep_for`."""
        return self.kept.keep_for()

    # -- results ---------------------------------------------------------------------------------
    def result(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` by (distance, id).

        Raises
        ------
        KeyError
            ``qid`` is not held here.
        """
        slot = self.state.queries.slot(qid)
        if slot is None:
            raise KeyError(qid)
        return sorted(self.state.result_row(slot), key=lambda e: (e[1], e[0]))

    def regions(self) -> tuple[pa.Table, np.ndarray]:
        """The registered queries (the query file's columns, :meth:`QueryTable.table`) and their
        kNN radii ``r_q`` (``(m,)`` float64 meters, ``inf`` below ``k`` results): what the
        routing table must cover for this worker."""
        q = self.state.queries
        live = np.flatnonzero(q.alive)
        return q.table(live), q.radius[live].copy()

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
        st = self.state
        return WorkerStats(worker=st.worker_id, node=node, pid=os.getpid(), queries=int(st.queries.alive.sum()),
                           expired=self.window.expired, refilled=self.window.refills, index_entries=st.index.entries,
                           refreshed=st.refreshed, keywords=len(st.vocabulary),
                           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                           rss_mb=_mb(resident_bytes()), rss_anon_mb=_mb(resident_bytes("RssAnon")))
