"""Releasing a batch's changes in parts, objects in Short-Job-First order (Wang, Zhang and
Kitsuregawa): each object's changes go out as soon as it is done, so the cheap ones do not wait
for the expensive ones. The R-tree index's BatchSearch
(:meth:`~knnmon.workers.rtree_index.RTreeIndex.batch_search`) gives the groups; with another
index, the batch's exact candidates grouped by their count (:func:`sjf_groups`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from knnmon.batch import BatchChanges, ObjectColumns
from knnmon.reports import WorkerReport
from knnmon.workers.rtree_index import RTreeIndex, SearchGroup
from knnmon.workers.state import WorkerState
from knnmon.workers.window_lists import WindowLists

if TYPE_CHECKING:
    from knnmon.workers.batch_update import BatchUpdate

__all__ = ["ReleaseInParts", "sjf_groups"]


def sjf_groups(obj: np.ndarray, slot: np.ndarray, n: int, size: int) -> Iterator[SearchGroup]:
    """A batch's exact candidate pairs (``(c,)`` int64 ``obj``, ``slot``; ``n`` objects) cut
    into Short-Job-First groups of ``size`` objects: the objects by ascending candidate count
    (ties in batch order), each group with its pairs. An index without BatchSearch releases a
    batch in parts with these (:class:`KnnWorker`'s ``release_groups``)."""
    work = np.bincount(obj, minlength=n).astype(np.int64)
    order = np.argsort(work, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    g = rank[obj] // size
    by = np.argsort(g, kind="stable")
    obj, slot, g = obj[by], slot[by], g[by]
    cut = np.searchsorted(g, np.arange(-(-n // size) + 1))
    for i in range(len(cut) - 1):
        objs = order[i * size:(i + 1) * size]
        yield SearchGroup(objs, work[objs], obj[cut[i]:cut[i + 1]], slot[cut[i]:cut[i + 1]])


class ReleaseInParts:
    """Release in parts for a :class:`~knnmon.workers.worker.KnnWorker` (module docstring): over
    its :class:`~knnmon.workers.state.WorkerState`, with the ``window`` whose expiry's changes go
    out first and the ``update`` that merges each group (:meth:`BatchUpdate.apply`)."""

    def __init__(self, state: WorkerState, window: WindowLists, update: BatchUpdate) -> None:
        self.state, self.window, self.update = state, window, update

    def _groups(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray
                ) -> Iterator[SearchGroup]:
        """The batch's objects in Short-Job-First groups with their candidate pairs, at most
        ``release_groups`` of them: the R-tree index's BatchSearch, else the exact candidates
        grouped by their count per object (:func:`sjf_groups`)."""
        size = -(-len(lon) // self.state.settings.release_groups)
        if isinstance(self.state.index, RTreeIndex):
            return self.state.index.batch_search(lon, lat, pair_obj, pair_code, group=size)
        return sjf_groups(*self.state.index.candidates(lon, lat, pair_obj, pair_code), len(lon), size)

    def process(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None,
                rows: np.ndarray) -> WorkerReport:
        """:meth:`BatchUpdate.process_batch` released in parts (``release_groups``): an expiry's changes
        first, then group by group in Short-Job-First order, each group's objects merged, its
        changes written (:meth:`ResultWriter.write_part`) and its shrunk radii applied before
        the next group is searched; the index is re-indexed once, at the end (a shrunk region
        lies inside its indexed one, so the later groups' candidates stay a superset)."""
        none, n = np.empty(0, dtype=np.int64), len(ids)
        released = np.zeros(n)
        part, server_s, redis_s = 0, 0.0, 0.0
        n_candidates = n_passed = n_written = 0
        shrunk: list[np.ndarray] = []

        def write(changes: BatchChanges | None, objs: np.ndarray, last: bool) -> None:
            nonlocal part, server_s, redis_s
            if self.state.writer is not None:
                t1 = time.perf_counter()
                changes = changes if changes is not None else BatchChanges([], [], [], [], [], [],
                                                                           version=self.state.version, details={})
                server_s += self.state.writer.write_part(batch, part, last, rows[objs].tolist(), changes)
                redis_s += time.perf_counter() - t1
            part += 1

        if self.window.before is not None:  # an expiry touched results: its changes are part 0
            changes, written = self.window.changes(ObjectColumns(ids, lon, lat, t, keywords), None)
            if len(written):
                write(changes, none, False)
                n_written += len(written)
        po, pc = pairs if pairs is not None else self.state.vocabulary.encode(keywords)
        groups = self._groups(lon, lat, po, pc)
        n_groups = -(-n // (-(-n // self.state.settings.release_groups)))
        for g, grp in enumerate(groups):
            last = g == n_groups - 1
            n_candidates += len(grp.obj)
            m, changed, changes, written = self.update.apply(ids, lon, lat, t, keywords, grp.obj, grp.slot)
            n_passed += m.passed if m is not None else 0
            if len(written) or (last and part > 0):
                write(changes, grp.objects, last)
                n_written += len(written)
            released[grp.objects] = time.time() * 1e3
            if len(changed):
                shrunk.append(self.state.shrink(changed, refresh=False))
        t2 = time.perf_counter()
        if shrunk:
            self.state.refresh(np.unique(np.concatenate(shrunk)))
        self.state.release_handles()
        index_s = time.perf_counter() - t2
        return WorkerReport(worker=self.state.worker_id, batch=batch, objects=n, candidates=n_candidates,
                            passed=n_passed, changed=n_written, busy_s=0.0, redis_s=redis_s, redis_server_s=server_s,
                            index_s=index_s, released=(rows, released))
