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

__all__ = ["AHEAD_LISTS", "AHEAD_MS", "AHEAD_STEP_MS", "DueTable"]

#: A batch searches successors (:class:`~knnmon.refills.Refills`, ``after_ms``) for the lists
#: due within this many ms past its cutoff ...
AHEAD_MS = 10_000
#: ... at most this many, less the lists the batch refills (a quiet batch searches ahead; a wave's
#: does not) ...
AHEAD_LISTS = 2_000
#: ... in groups of those due within this many ms of the earliest of them, each searched at once
#: over the objects after its deadline.
AHEAD_STEP_MS = 1_000


class DueTable:
    """One worker's announced deadlines: query id -> (deadline epoch ms, the query's columns row)."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[int, str, float, float, tuple[str, ...], int]] = {}
        # (deadline, query id) of every announcement, earliest first; one that a later
        # announcement replaced or a take removed is skipped when it comes up (and dropped
        # with a rebuild once they outnumber the live ones).
        self._heap: list[tuple[int, str]] = []
        self._searched: set[str] = set()  # taken ahead, not yet refilled: not searched ahead again

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
                self._searched.discard(qid)
            else:
                self._due[qid] = (at, qid, float(lon), float(lat), tuple(words), int(k))
                heapq.heappush(self._heap, (at, qid))
        if len(self._heap) > 2 * len(self._due) + 1024:
            self._heap = [row[:2] for row in self._due.values()]
            heapq.heapify(self._heap)

    def take(self, cutoff: int) -> QueryColumns:
        """The queries due by ``cutoff`` (deadline <= cutoff, epoch ms), earliest first, removed
        from the table: the batch moving the window to ``cutoff`` refills them."""
        return self._pop(cutoff, None)[0]

    def ahead(self, until_ms: int, limit: int) -> tuple[QueryColumns, np.ndarray]:
        """The first ``limit`` queries due by ``until_ms`` (epoch ms), earliest first, and their
        deadlines (``(m,)`` int64 epoch ms), removed from the table: their successors are
        searched ahead (:class:`~knnmon.refills.Refills`, ``after_ms``). One taken ahead before
        and announced again (its successor will be short) stays, to be refilled when due."""
        return self._pop(until_ms, limit, ahead=True)

    def _pop(self, until_ms: int, limit: int | None, ahead: bool = False) -> tuple[QueryColumns, np.ndarray]:
        due, heap, kept = [], self._heap, []
        while heap and heap[0][0] <= until_ms and (limit is None or len(due) < limit):  # O(taken log n)
            at, qid = heapq.heappop(heap)
            row = self._due.get(qid)
            if row is not None and row[0] == at:
                if ahead and qid in self._searched:
                    kept.append((at, qid))
                    continue
                del self._due[qid]
                due.append(row)
                (self._searched.add if ahead else self._searched.discard)(qid)
        for entry in kept:
            heapq.heappush(heap, entry)
        if not due:
            return QueryColumns.of([]), np.empty(0, dtype=np.int64)
        return (QueryColumns([r[1] for r in due], np.array([r[2] for r in due], dtype=np.float64),
                             np.array([r[3] for r in due], dtype=np.float64), [list(r[4]) for r in due],
                             np.array([r[5] for r in due], dtype=np.int64)),
                np.array([r[0] for r in due], dtype=np.int64))
