"""Candidates to kNN lists: each query's candidates ranked nearest first, ties by object id, each
object once, the first ``k`` kept -- one compiled pass (a counting sort by query, then a small
sort per query) where a three-key ``lexsort`` over every candidate cost more than the search that
found them in a refill wave (docs/window.md, "Refill waves").

Used by :meth:`~knnmon.coordinator.runtime.object_index.ObjectIndex.knn_v` (the candidates of a
query's keywords' trees, tie keys the objects' exact ranks in id order) and
:meth:`~knnmon.coordinator.runtime.object_store.ObjectStore.knn_v` (the lists of a window's parts
merged, tie keys the ids' first 8 bytes, :func:`~knnmon.encoding.id_prefix_keys`: equal keys
are flagged for the caller to order by the ids themselves).
"""

from __future__ import annotations

import numpy as np

from knnmon.jit import jit

__all__ = ["compile_ranking", "nearest_first"]


@jit
def _before(d: np.ndarray, key: np.ndarray, obj: np.ndarray, a: int, b: int) -> bool:
    """Candidate ``a`` ranks before ``b``: by distance, then tie key, then object."""
    if d[a] != d[b]:
        return d[a] < d[b]
    if key[a] != key[b]:
        return key[a] < key[b]
    return obj[a] < obj[b]


@jit
def nearest_first(q: np.ndarray, d: np.ndarray, key: np.ndarray, obj: np.ndarray, k: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank candidates per query and keep each query's first ``k``.

    Parameters
    ----------
    q
        ``(n,)`` int64: each candidate's query, ``0 <= q < m``.
    d
        ``(n,)`` float64 meters: its distance to the query.
    key
        ``(n,)`` uint64: its object's tie key, in id order (equal distances rank by it).
    obj
        ``(n,)`` int64: its object (the same object found twice, e.g. through two keywords,
        carries the same distance and key: kept once).
    k
        ``(m,)`` int64, each ``>= 0``: the entries to keep per query.

    Returns
    -------
    take
        ``(sum(counts),)`` int64: positions of the kept candidates, query by query, nearest
        first.
    counts
        ``(m,)`` int64: ``min(k, distinct objects)`` per query.
    tied
        ``(m,)`` bool: two different objects with equal distance and equal key among a query's
        first ``k + 1`` (their order, and maybe which of them is kept, is the caller's to settle
        by the ids themselves; never with exact ranks as keys).
    """
    m, n = len(k), len(q)
    start = np.zeros(m + 1, dtype=np.int64)
    for j in range(n):
        start[q[j] + 1] += 1
    for i in range(m):
        start[i + 1] += start[i]
    fill = start[:m].copy()
    perm = np.empty(n, dtype=np.int64)
    for j in range(n):
        perm[fill[q[j]]] = j
        fill[q[j]] += 1
    take = np.empty(n, dtype=np.int64)
    counts = np.zeros(m, dtype=np.int64)
    tied = np.zeros(m, dtype=np.bool_)
    t = 0
    for i in range(m):
        a, b = start[i], start[i + 1]
        if b - a > 1:  # by distance (stable), then equal distances by key and object
            seg = perm[a:b]
            seg[:] = seg[np.argsort(d[seg], kind="mergesort")]
            r = a
            while r < b:
                e = r + 1
                while e < b and d[perm[e]] == d[perm[r]]:
                    e += 1
                for x in range(r + 1, e):  # insertion sort of the (short) run of equal distances
                    v, y = perm[x], x - 1
                    while y >= r and _before(d, key, obj, v, perm[y]):
                        perm[y + 1] = perm[y]
                        y -= 1
                    perm[y + 1] = v
                r = e
        kept, prev = 0, -1
        for x in range(a, b):
            c = perm[x]
            if prev >= 0 and obj[c] == obj[prev]:
                continue  # the same object again
            if prev >= 0 and d[c] == d[prev] and key[c] == key[prev]:
                tied[i] = True
            if kept == k[i]:
                break
            take[t] = c
            t += 1
            kept += 1
            prev = c
        counts[i] = kept
    return take[:t], counts, tied


def compile_ranking() -> None:
    """Compile (or load from the cache) the kernel before the first search needs it."""
    one = np.zeros(1, dtype=np.int64)
    nearest_first(one, np.zeros(1), np.zeros(1, dtype=np.uint64), one, np.ones(1, dtype=np.int64))
