"""Each query's next list: its kNN for after its current list runs out, searched ahead (refill ahead).

With a window, a region's objects arrive together and expire together, so every query there runs
out of neighbours in the same few batches and needs a refill search at once: a **refill wave**
(docs/window.md). A list's members' times say when it will run out: at the cutoff
``c_q`` = the ``k``-th largest time among its entries strictly within ``r_q`` (at that cutoff
fewer than ``k`` of them are live). Batches before that, the worker names the lists that will run
out within a horizon (:meth:`NextLists.due`), a budget at a time, and the coordinator searches
each one's **next list** over the objects that will still be live then: its ``k + reserve``
nearest among the objects with ``t > c_q`` (``ObjectStore.knn_v(floor=)``). The worker keeps it
beside the current list and merges every later batch's objects into it as well (the query index
covers both radii), so it holds, at every batch:

    every matching object with ``t > floor`` strictly within ``radius`` (its last distance when
    it was last full, ``inf`` if it never was).

When the expiry at a cutoff ``>= floor`` empties the current list, every live object has
``t > floor``, so the next list's live entries are all the live matching objects strictly within
its radius: if ``k`` of them lie strictly within it, they are the exact kNN and the list
replaces the current one with no search (:meth:`NextLists.ready`); otherwise the query is
refilled as before. The searches move from the wave's batch to the batches before it, a budget
per batch. Arrivals can only delay a list's run-out or leave it where it was, except where one
pushes a tied entry out of the list; then the next list is not ready and the refill is searched.

The state is a second set of flat lists beside :class:`~knnmon.workers.topk_lists.TopKLists`,
places appended per next list and released when it is used or dropped.
"""

from __future__ import annotations

import numpy as np

from knnmon.arrays import runs, with_capacity

__all__ = ["AHEAD_BUDGET", "NEXT_CAP", "SCANS_PER_HORIZON", "NextLists", "run_out"]

#: Next lists a worker asks for per batch, at most (the soonest first).
AHEAD_BUDGET = 1000
#: A next list keeps this many times its query's ``k + reserve`` places: its nearest entries
#: above its floor may still expire before the batch whose expiry empties the list (the floor
#: is the run-out cutoff, and a batch's cutoff passes it by up to a batch of event time).
NEXT_CAP = 3
#: The lists due are found by a scan of every list this many times per horizon of event time,
#: and asked for from what that scan found, a budget a batch, in between.
SCANS_PER_HORIZON = 6


def run_out(slot: np.ndarray, t: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Each list's run-out cutoff: the ``k``-th largest time of its entries (those strictly within
    its ``r_q``), where fewer than ``k`` of them stay live.

    Parameters
    ----------
    slot, t
        ``(e,)`` int64 each: the entries' list and time (epoch ms), grouped by ``slot`` in
        ascending order.
    k
        ``(e,)`` int64: each entry's list's ``k``.

    Returns
    -------
    numpy.ndarray
        ``(u,)`` int64, for each distinct ``slot`` in order; ``np.iinfo(np.int64).min`` for a
        list with fewer than ``k`` entries (it has run out already).

    Examples
    --------
    >>> run_out(np.array([0, 0, 0, 2, 2]), np.array([5, 9, 7, 1, 3]), np.array([2, 2, 2, 3, 3])).tolist()
    [7, -9223372036854775808]
    """
    if not len(slot):
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((-t, slot))
    s, tt, kk = slot[order], t[order], k[order]
    first = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    n = np.diff(np.append(first, len(s)))
    out = np.full(len(first), np.iinfo(np.int64).min, dtype=np.int64)
    ok = n >= kk[first]
    out[ok] = tt[first[ok] + kk[first[ok]] - 1]
    return out


class NextLists:
    """The next lists of a worker's query slots (module docstring): per slot ``ptr`` (its first
    place, ``-1``: none), ``count``, ``radius`` (float64 meters), ``floor`` (int64 epoch ms);
    places in ``d`` (float64 meters) and ``h`` (int64 object handles), ``cap`` places a list,
    nearest first as :class:`~knnmon.workers.topk_lists.TopKLists` keeps them. ``released``
    counts the places of lists used or dropped."""

    def __init__(self) -> None:
        self.ptr = np.empty(0, dtype=np.int64)
        self.count = np.empty(0, dtype=np.int64)
        self.radius = np.empty(0)
        self.floor = np.empty(0, dtype=np.int64)
        self.d = np.empty(0)
        self.h = np.empty(0, dtype=np.int64)
        self.used = 0  # places appended so far
        self.released = 0
        self.held = 0  # slots with a next list

    def __len__(self) -> int:
        """Slots with a next list."""
        return self.held

    def _grow(self, n_slots: int) -> None:
        if len(self.ptr) < n_slots:
            m = len(self.ptr)
            self.ptr = with_capacity(self.ptr, n_slots)
            self.ptr[m:] = -1
            self.count = with_capacity(self.count, n_slots)
            self.radius = with_capacity(self.radius, n_slots)
            self.floor = with_capacity(self.floor, n_slots)

    def has(self, slots: np.ndarray) -> np.ndarray:
        """``(m,)`` bool: which of ``slots`` have a next list."""
        slots = np.asarray(slots, dtype=np.int64)
        out = np.zeros(len(slots), dtype=bool)
        inside = slots < len(self.ptr)
        out[inside] = self.ptr[slots[inside]] >= 0
        return out

    def index_radius(self, slots: np.ndarray, radius: np.ndarray) -> np.ndarray:
        """The radius the query index must cover for ``slots`` (``radius``: their ``r_q``,
        ``(m,)`` float64): the larger of ``r_q`` and the next list's radius."""
        has = self.has(slots)
        if not has.any():
            return radius
        out = np.array(radius, dtype=np.float64)
        out[has] = np.maximum(out[has], self.radius[np.asarray(slots)[has]])
        return out

    def set(self, slots: np.ndarray, cap: np.ndarray, counts: np.ndarray, d: np.ndarray, h: np.ndarray,
            radius: np.ndarray, floor: np.ndarray) -> None:
        """Give ``slots`` (distinct) next lists: ``counts[i] <= cap[i]`` entries of ``d``, ``h``
        (``(sum(counts),)``, list by list, nearest first), their radius and floor; a slot's
        earlier next list is released."""
        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self._grow(int(slots.max()) + 1)
        self.clear(slots, cap)
        cap, counts = np.asarray(cap, dtype=np.int64), np.asarray(counts, dtype=np.int64)
        start = self.used + np.cumsum(cap) - cap
        self.used += int(cap.sum())
        self.d = with_capacity(self.d, self.used)
        self.h = with_capacity(self.h, self.used)
        whole = runs(start, cap)
        self.d[whole], self.h[whole] = np.inf, -1
        at = runs(start, counts)
        self.d[at], self.h[at] = d, h
        self.ptr[slots], self.count[slots] = start, counts
        self.radius[slots], self.floor[slots] = radius, floor
        self.held += len(slots)

    def entries(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slot, handle, distance)`` of every entry of ``slots``' next lists (each has one),
        ``(e,)`` each, list by list, nearest first."""
        c = self.count[slots]
        at = runs(self.ptr[slots], c)
        return np.repeat(slots, c), self.h[at], self.d[at]

    def clear(self, slots: np.ndarray, cap: np.ndarray | None = None) -> None:
        """Drop the next lists of ``slots`` (those without one are skipped); ``cap``: their
        places, counted as released when given."""
        slots = np.asarray(slots, dtype=np.int64)
        has = self.has(slots)
        if not has.any():
            return
        gone = slots[has]
        if cap is not None:
            self.released += int(np.asarray(cap)[has].sum())
        self.ptr[gone] = -1
        self.held -= len(gone)

    def pack(self, cap: np.ndarray) -> None:
        """Keep only the places of the next lists held (``cap``: every slot's places), once the
        released ones are half of those appended."""
        if self.used < 4096 or self.released * 2 < self.used:
            return
        slots = np.flatnonzero(self.ptr >= 0)
        c = cap[slots]
        at = runs(self.ptr[slots], c)
        self.d, self.h = self.d[at].copy(), self.h[at].copy()
        self.ptr[slots] = np.cumsum(c) - c
        self.used, self.released = int(c.sum()), 0

    def keep(self, keep: np.ndarray) -> None:
        """Slots renumbered: keep those of ``keep`` (sorted), slot ``keep[i]`` becoming ``i``."""
        self._grow(int(keep.max(initial=-1)) + 1)
        dropped = np.setdiff1d(np.flatnonzero(self.ptr >= 0), keep)
        self.held -= len(dropped)
        self.ptr, self.count = self.ptr[keep], self.count[keep]
        self.radius, self.floor = self.radius[keep], self.floor[keep]

    def handles(self) -> np.ndarray:
        """Every handle held by a next list (unsorted, repeats possible)."""
        slots = np.flatnonzero(self.ptr >= 0)
        _, h, _ = self.entries(slots)
        return h[h >= 0]

    def renumber(self, remap: np.ndarray) -> None:
        """Map every held handle through ``remap`` (:meth:`ObjectHandles.compact`)."""
        held = self.h[:self.used] >= 0
        self.h[:self.used] = np.where(held, remap[np.maximum(self.h[:self.used], 0)], -1)
