"""The coordinator's side of refill deadlines: what each worker announced
(:class:`~knnmon.refills.DueLists`, :mod:`knnmon.workers.window_lists`), so that a windowed
batch carries the refills its cutoff needs without asking the workers first.

The table is a hint, never the authority: a list missing from it (an announcement lost with a
restarted service, a revived worker) costs the batch a second call, not exactness; a list in it
that no longer needs a refill (unregistered, moved) costs one search.
"""

from __future__ import annotations

import heapq

import numpy as np

from knnmon.query import QueryColumns
from knnmon.refills import NEVER, DueLists

__all__ = ["DueTable"]


class DueTable:
    """One worker's announced deadlines: query id -> (deadline epoch ms, the query's columns row)."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[int, str, float, float, tuple[str, ...], int]] = {}
        # (deadline, query id) of every announcement, earliest first; one that a later
        # announcement replaced or a take removed is skipped when it comes up (and dropped
        # with a rebuild once they outnumber the live ones).
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._due)

    def absorb(self, due: DueLists | None) -> None:
        """Apply a worker's announcement (a deadline of :data:`~knnmon.refills.NEVER` withdraws)."""
        if due is None or not len(due.deadline_ms):
            return
        q = due.queries
        for qid, lon, lat, words, k, at in zip(q.ids, q.lon, q.lat, q.keywords, q.k, due.deadline_ms.tolist()):
            if at == NEVER:
                self._due.pop(qid, None)
            else:
                self._due[qid] = (at, qid, float(lon), float(lat), tuple(words), int(k))
                heapq.heappush(self._heap, (at, qid))
        if len(self._heap) > 2 * len(self._due) + 1024:
            self._heap = [row[:2] for row in self._due.values()]
            heapq.heapify(self._heap)

    def take(self, cutoff: int) -> QueryColumns:
        """The queries due by ``cutoff`` (deadline <= cutoff, epoch ms), earliest first, removed
        from the table: the batch moving the window to ``cutoff`` refills them."""
        due, heap = [], self._heap
        while heap and heap[0][0] <= cutoff:  # O(taken log n): not a pass over every list held
            at, qid = heapq.heappop(heap)
            row = self._due.get(qid)
            if row is not None and row[0] == at:
                del self._due[qid]
                due.append(row)
        if not due:
            return QueryColumns.of([])
        return QueryColumns([r[1] for r in due], np.array([r[2] for r in due], dtype=np.float64),
                            np.array([r[3] for r in due], dtype=np.float64), [list(r[4]) for r in due],
                            np.array([r[5] for r in due], dtype=np.int64))
