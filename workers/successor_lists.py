"""Successor lists: a windowed query's next list, searched ahead of its deadline, so that the batch
whose cutoff reaches the deadline swaps lists instead of waiting for a refill (issue 66).

The coordinator searches, in a quiet batch, the ``k + reserve`` nearest of a list due soon over
the objects of ``t > T`` only (``T`` at most its deadline: :class:`~knnmon.refills.Refills`,
``after_ms``). Every object of ``t > T`` strictly within that list's radius ``r_s`` is in it,
and stays so: each batch's arrivals within ``r_s`` are merged into it as into the query's own
list (the query's region is indexed and routed out to ``max(r_q, r_s)``), and ``r_s`` shrinks
as it fills. At a cutoff ``c >= T`` every live object has ``t > c >= T``, so the successor less
its members of ``t <= c`` holds every live object within ``r_s``: it is an exact list with
``r_q = r_s``, and takes the query's list's place (:meth:`WindowLists.expire
<knnmon.workers.window_lists.WindowLists.expire>`). One with fewer than ``k`` left is refilled
as any short list is. A successor lost (a restart, a hand-over, a tie the merge leaves to the
ids) costs its list a refill at the deadline, never exactness.
"""

from __future__ import annotations

import numpy as np

from knnmon.workers import kernels
from knnmon.workers.topk_lists import TopKLists

__all__ = ["SuccessorLists"]


class SuccessorLists:
    """At most one successor per query slot, in rows of flat lists (:class:`TopKLists`, a row's
    ``cap`` the query's): per slot ``row`` (``-1``: none); per row its ``slot`` (``-1``:
    released), ``after`` (``T``, epoch ms), ``radius`` (``r_s``, meters; ``inf`` below ``cap``
    entries) and ``deadline`` (its own, as a list's: kept by
    :meth:`~knnmon.workers.window_lists.WindowLists.announce`)."""

    def __init__(self) -> None:
        self.row = np.empty(0, dtype=np.int64)
        self.slot = np.empty(0, dtype=np.int64)
        self.after = np.empty(0, dtype=np.int64)
        self.radius = np.empty(0)
        self.cap = np.empty(0, dtype=np.int64)
        self.deadline = np.empty(0, dtype=np.int64)
        self.lists = TopKLists()

    def __len__(self) -> int:
        """Successors held."""
        return int((self.slot >= 0).sum())

    def rows_of(self, slots: np.ndarray) -> np.ndarray:
        """``(m,)`` int64: the successor row of each of ``slots``, ``-1`` for none."""
        slots = np.asarray(slots, dtype=np.int64)
        out = np.full(len(slots), -1, dtype=np.int64)
        held = slots < len(self.row)
        out[held] = self.row[slots[held]]
        return out

    def install(self, slots: np.ndarray, cap: np.ndarray, after: np.ndarray, d: np.ndarray, h: np.ndarray,
                count: np.ndarray, radius: np.ndarray) -> None:
        """Successors for ``slots`` (``(m,)`` int64, distinct; one held before is replaced):
        ``cap``, ``count`` ``(m,)`` int64, ``after`` ``(m,)`` int64 epoch ms, ``radius`` ``(m,)``
        float64 meters, their places ``d``, ``h`` (``(sum(cap),)``, each row's ``cap`` places)."""
        self.release(self.rows_of(slots))
        if len(self.row) <= slots.max(initial=-1):
            self.row = np.concatenate([self.row, np.full(slots.max() + 1 - len(self.row), -1, dtype=np.int64)])
        self.row[slots] = len(self.slot) + np.arange(len(slots))
        self.slot = np.concatenate([self.slot, slots])
        self.after = np.concatenate([self.after, after])
        self.radius = np.concatenate([self.radius, radius])
        self.cap = np.concatenate([self.cap, cap])
        self.deadline = np.concatenate([self.deadline, np.full(len(slots), np.iinfo(np.int64).min)])
        self.lists.append(cap, d, h, count)

    def release(self, rows: np.ndarray) -> None:
        """Drop the successors of ``rows`` (``-1`` entries ignored)."""
        rows = rows[rows >= 0]
        if len(rows):
            self.row[self.slot[rows]] = -1
            self.slot[rows] = -1
            self.lists.release(rows, self.cap[rows])

    def tidy(self) -> None:
        """Compact the rows once most are released (their places move: not amid a merge)."""
        if len(self.slot) > 1024 and (self.slot >= 0).sum() < len(self.slot) // 2:
            keep = np.flatnonzero(self.slot >= 0)
            self.lists.compact(keep, self.cap[keep])
            self.slot, self.after, self.radius, self.cap, self.deadline = (
                a[keep] for a in (self.slot, self.after, self.radius, self.cap, self.deadline))
            self.row[self.slot] = np.arange(len(keep))

    def due(self, cutoff: int) -> np.ndarray:
        """The rows whose ``T <= cutoff`` (epoch ms): exact lists at that cutoff."""
        return np.flatnonzero((self.slot >= 0) & (self.after <= cutoff))

    def merge(self, obj: np.ndarray, slot: np.ndarray, d: np.ndarray, okey: np.ndarray, k: np.ndarray,
              hkey: np.ndarray, n_obj: int) -> tuple[np.ndarray, ...]:
        """Merge a batch's pairs (``(p,)`` int64 batch positions, int64 query slots, float64
        meters) into the successors of their slots (:func:`~knnmon.workers.kernels.merge_topk`:
        ``okey``, ``hkey`` and ``n_obj`` as there; ``k`` per slot). A row the kernel leaves to
        the ids (tied keys) is dropped. Returns the entered ``(e_obj, e_place)`` (the caller
        writes their handles at ``e_place``), the slots whose successor changed and those whose
        ``r_s`` shrank (re-indexed by the caller), ``(x,)`` int64 each."""
        row = self.rows_of(slot)
        sel = np.flatnonzero(row >= 0)
        none = np.empty(0, dtype=np.int64)
        if not len(sel):
            return none, none, none, none
        rows, L = row[sel], self.lists
        out = kernels.merge_topk(obj[sel], rows, d[sel], okey, self.radius, k[np.maximum(self.slot, 0)], self.cap,
                                 L.ptr, L.count, L.d, L.h, hkey, n_obj)
        changed, e_obj, e_place, fallback = out[1], out[4], out[6], out[11]
        self.release(fallback)  # (the kernel left them untouched)
        last = L.d[L.ptr[changed] + self.cap[changed] - 1]  # inf unless full
        shrunk = changed[last < self.radius[changed]]
        self.radius[shrunk] = L.d[L.ptr[shrunk] + self.cap[shrunk] - 1]
        return e_obj, e_place, np.sort(self.slot[changed]), self.slot[shrunk]

    def renumber(self, keep: np.ndarray) -> None:
        """The live slots ``keep`` (``(m,)`` int64, sorted) become ``0..m-1`` (a compaction); the
        successors of other slots must have been released."""
        held = self.slot >= 0
        self.slot[held] = np.searchsorted(keep, self.slot[held])
        self.row = np.full(len(keep), -1, dtype=np.int64)
        self.row[self.slot[held]] = np.flatnonzero(held)

    def held(self) -> np.ndarray:
        """The handles the successors hold (with repeats)."""
        return self.lists.h[self.lists.h >= 0]

    def clear(self) -> None:
        """Drop every successor."""
        self.__init__()
