"""Every query's kept neighbours in two flat arrays: memory follows the sum of the queries' ``k``.

Query slot ``s`` keeps ``cap[s]`` places (its ``k`` plus a window's reserve) at ``ptr[s] ..
ptr[s] + cap[s] - 1`` of ``d`` (float64 meters, ``inf`` padded) and ``h`` (int64 object handles,
:mod:`knnmon.workers.object_handles`; ``-1`` padded), nearest first (entries at equal distance
in any order), its first ``count[s]`` filled; its result is the first ``min(count, k)``. The
batch kernels (:func:`knnmon.workers.kernels.merge_topk`) update them in place.
"""

from __future__ import annotations

import numpy as np

from knnmon.arrays import runs

__all__ = ["TopKLists"]


class TopKLists:
    """The flat top-k lists (module docstring); ``released`` counts the places of dropped
    queries not yet compacted away."""

    def __init__(self) -> None:
        self.ptr = np.empty(0, dtype=np.int64)
        self.d = np.empty(0)
        self.h = np.empty(0, dtype=np.int64)
        self.count = np.empty(0, dtype=np.int64)
        self.released = 0

    def append(self, cap: np.ndarray, d: np.ndarray, h: np.ndarray, count: np.ndarray) -> None:
        """Add lists for new slots: ``cap``, ``count`` ``(n,)`` int64 and their places
        ``d``, ``h`` ``(sum(cap),)`` (each list's ``cap`` places in a row)."""
        start = np.cumsum(cap) - cap
        self.ptr = np.concatenate([self.ptr, len(self.d) + start])
        self.d = np.concatenate([self.d, d])
        self.h = np.concatenate([self.h, h])
        self.count = np.concatenate([self.count, count])

    def places(self, slots: np.ndarray, n: np.ndarray) -> np.ndarray:
        """The flat positions of the first ``n`` places of each of ``slots``, in order."""
        return runs(self.ptr[slots], n)

    def row(self, slot: int, n: int) -> tuple[list[int], list[float]]:
        """The handles and distances of ``slot``'s first ``n`` places."""
        a = int(self.ptr[slot])
        return self.h[a:a + n].tolist(), self.d[a:a + n].tolist()

    def release(self, slots: np.ndarray, cap: np.ndarray) -> None:
        """Empty the lists of dropped ``slots`` (``cap``: their places)."""
        places = runs(self.ptr[slots], cap)
        self.d[places], self.h[places], self.count[slots] = np.inf, -1, 0
        self.released += int(cap.sum())

    def compact(self, keep: np.ndarray, cap: np.ndarray) -> None:
        """Keep the lists of ``keep`` (sorted slots, ``cap`` their places) only, renumbered."""
        places = runs(self.ptr[keep], cap)
        self.d, self.h = self.d[places], self.h[places]
        self.ptr = np.cumsum(cap) - cap
        self.count = self.count[keep]
        self.released = 0

    def renumber(self, remap: np.ndarray) -> None:
        """Map every held handle through ``remap`` (:meth:`ObjectHandles.compact`)."""
        held = self.h >= 0
        self.h = np.where(held, remap[np.maximum(self.h, 0)], -1)
