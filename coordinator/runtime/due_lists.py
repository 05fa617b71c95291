"""The coordinator's side of refill deadlines: what each worker announced
(:class:`~knnmon.batch.DueLists`, :mod:`knnmon.workers.window_lists`), so that a windowed
batch carries the refills its cutoff needs without asking the workers first.

The table is a hint, never the authority: a list missing from it (an announcement lost with a
restarted service, a revived worker) costs the batch a second call, not exactness; a list in it
that no longer needs a refill (unregistered, moved) costs one search.
"""

from __future__ import annotations

import numpy as np

from knnmon.batch import NEVER, DueLists
from knnmon.query import QueryColumns

__all__ = ["DueTable"]


class DueTable:
    """One worker's announced deadlines: query id -> (deadline epoch ms, the query's columns row)."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[int, str, float, float, tuple[str, ...], int]] = {}
        self._first = NEVER  # a lower bound of the earliest deadline held

    def __len__(self) -> int:
        return len(self._due)

    def absorb(self, due: DueLists | None) -> None:
        """Apply a worker's announcement (a deadline of :data:`~knnmon.batch.NEVER` withdraws)."""
        if due is None or not len(due.deadline_ms):
            return
        q = due.queries
        for qid, lon, lat, words, k, at in zip(q.ids, q.lon, q.lat, q.keywords, q.k, due.deadline_ms.tolist()):
            if at == NEVER:
                self._due.pop(qid, None)
            else:
                self._due[qid] = (at, qid, float(lon), float(lat), tuple(words), int(k))
                self._first = min(self._first, at)

    def take(self, cutoff: int) -> QueryColumns:
        """The queries due by ``cutoff`` (deadline <= cutoff, epoch ms), removed from the table:
        the batch moving the window to ``cutoff`` refills them."""
        if cutoff < self._first:
            return QueryColumns.of([])
        due = [row for row in self._due.values() if row[0] <= cutoff]
        for row in due:
            del self._due[row[1]]
        self._first = min((row[0] for row in self._due.values()), default=NEVER)
        return QueryColumns([r[1] for r in due], np.array([r[2] for r in due], dtype=np.float64),
                            np.array([r[3] for r in due], dtype=np.float64), [list(r[4]) for r in due],
                            np.array([r[5] for r in due], dtype=np.int64))
