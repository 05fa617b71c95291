"""What a windowed batch carries besides its objects, typed:

- :class:`DueLists`: the lists whose reserve runs out soon, from the worker holding them to the
  coordinator (which sends their :class:`Refills` with the batch that needs them);
- :class:`Refills`: the exact kNN of the results an expiry emptied below ``k``, from the
  coordinator's live objects to the worker holding them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knnmon.batch import KnnColumns, ObjectColumns
from knnmon.query import QueryColumns

__all__ = ["DueLists", "NEVER", "Refills"]


@dataclass(frozen=True)
class Refills:
    """Refilled results for one worker: query ``queries[j]``'s exact kNN over the live objects is
    list ``j`` of ``topk`` (nearest first), each entry with its object's row in ``objects``
    (``topk.rows``), the details of every object in them. ``queries`` are the queries as searched
    (``k``: the neighbours searched, ``k + reserve``): a worker takes a list only for a query it
    holds with those parameters now."""

    queries: QueryColumns
    topk: KnnColumns
    objects: ObjectColumns

    def __post_init__(self) -> None:
        if self.topk.rows is None:
            raise ValueError("a refill's lists come with their objects' rows (topk.rows)")

    @property
    def qids(self) -> Sequence[str]:
        return self.queries.ids

    def __reduce__(self):
        """Sent without the lists' ids: those of ``objects`` at their rows, read back from there."""
        return _refills, (self.queries, self.topk.counts, self.topk.dist, self.topk.rows, self.objects)


def _refills(queries: QueryColumns, counts: Any, dist: Any, rows: Any, objects: ObjectColumns) -> Refills:
    """:class:`Refills` unpickled, its lists' ids those of ``objects`` at ``rows``."""
    return Refills(queries, KnnColumns(counts, np.asarray(objects.ids, dtype=object)[rows], dist, rows), objects)


#: A deadline that never comes (int64 epoch ms): a list that holds every match, or none.
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class DueLists:
    """What a worker announces after a windowed batch: the lists whose refill deadline changed
    and now falls within its horizon past the batch's cutoff (at least
    :data:`~knnmon.workers.window_lists.DUE_HORIZON_MS`), or left it.

    A list's deadline is the smallest cutoff at which an expiry leaves it short
    (:meth:`~knnmon.workers.window_lists.WindowLists.expire`): the ``k``-th largest time among
    its members strictly within ``r_q``, or its oldest member's time when fewer than ``k`` lie
    there (Mouratidis et al., SIGMOD 2006, §4: every expiry time is known on arrival).

    Attributes
    ----------
    queries : QueryColumns
        The ``m`` queries, ``k`` holding the neighbours a refill searches (``k + reserve``).
    deadline_ms : numpy.ndarray
        ``(m,)`` int64 epoch ms; :data:`NEVER`: no longer due within the horizon (withdrawn).
    """

    queries: QueryColumns
    deadline_ms: np.ndarray
