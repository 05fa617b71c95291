"""The coordinator's side of refill deadlines: what each worker announced
(:class:`~knnmon.batch.DueLists`, :mod:`knnmon.workers.window_lists`), so that a windowed
batch carries the refills its cutoff needs without asking the workers first.

The table is a hint, never the authority: a list missing from it (an announcement lost with a
restarted service, a revived worker) costs the batch a second call, not exactness; a list in it
that no longer needs a refill (unregistered, moved) costs one search.

**Refill ahead** (issue 66): a batch also refills, before their deadline, the lists due soonest,
within a budget that spreads every list announced over the horizon's batches
(:meth:`DueTable.take`): a wave of lists due at one cutoff is refilled over the batches before it,
earliest deadline first (which, for refills of one cost each, meets every deadline that any
schedule within the budget meets). A refill before the deadline is as exact as one at it: the
list is replaced by its query's exact list over the live objects; its result does not change (its
first ``k`` were exact still). A list refilled ahead is not refilled ahead again at the deadline
it had then: where nothing newer lies near it, the refill gives it the same deadline, which a
refill at that deadline then meets.
"""

from __future__ import annotations

import heapq

import numpy as np

from knnmon.batch import NEVER, DueLists
from knnmon.query import QueryColumns

__all__ = ["AHEAD_MAX", "DueTable"]

#: The most lists one batch refills ahead of their deadlines (:meth:`DueTable.take`).
AHEAD_MAX = 2_000


class DueTable:
    """One worker's announced deadlines: query id -> (deadline epoch ms, the query's columns row)."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[int, str, float, float, tuple[str, ...], int]] = {}
        self._first = NEVER  # a lower bound of the earliest deadline held
        self._ahead: dict[str, int] = {}  # refilled ahead: the deadline it had (not again at that one)
        self._cutoff: int | None = None  # the last cutoff taken
        #: Lists refilled ahead of their deadlines so far.
        self.refilled_ahead = 0

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
                self._ahead.pop(qid, None)
            else:
                self._due[qid] = (at, qid, float(lon), float(lat), tuple(words), int(k))
                self._first = min(self._first, at)

    def take(self, cutoff: int, horizon_ms: int) -> QueryColumns:
        """The queries due by ``cutoff`` (deadline <= cutoff, epoch ms), removed from the table
        (the batch moving the window to ``cutoff`` refills them), and the ones due soonest after
        it, refilled ahead (module docstring) and removed too (the worker announces their new
        deadlines): as many as make every list held refilled once over ``horizon_ms`` at the
        pace of the cutoff since the last call, at most :data:`AHEAD_MAX`, earliest deadline
        first, none at a deadline it was refilled ahead at."""
        step = cutoff - self._cutoff if self._cutoff is not None else 0
        self._cutoff = cutoff
        due = [row for row in self._due.values() if row[0] <= cutoff] if cutoff >= self._first else []
        for row in due:
            del self._due[row[1]]
            self._ahead.pop(row[1], None)
        budget = min(AHEAD_MAX, len(self._due) * max(step, 0) // max(horizon_ms, 1))
        if budget:
            ahead = heapq.nsmallest(budget, (r for r in self._due.values() if self._ahead.get(r[1]) != r[0]))
            for row in ahead:  # (the worker announces the deadline the refill gives)
                del self._due[row[1]]
                self._ahead[row[1]] = row[0]
            self.refilled_ahead += len(ahead)
            due += ahead
        if len(due):
            self._first = min((row[0] for row in self._due.values()), default=NEVER)
        return QueryColumns([r[1] for r in due], np.array([r[2] for r in due], dtype=np.float64),
                            np.array([r[3] for r in due], dtype=np.float64), [list(r[4]) for r in due],
                            np.array([r[5] for r in due], dtype=np.int64))
