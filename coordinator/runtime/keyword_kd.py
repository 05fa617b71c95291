"""Per-keyword k-d trees over objects' unit vectors, built and searched by compiled kernels.

:class:`~knnmon.coordinator.runtime.object_index.ObjectIndex` answers a kNN search over a set of
objects keyword by keyword (a query's keywords are a Boolean OR). Each keyword's posting list (the
rows of the objects carrying it) is ordered in place into an implicit k-d tree (Bentley 1975;
Friedman, Bentley and Finkel 1977): the node of a range ``[a, b)`` splits at its middle entry
``mid = (a + b) // 2`` on the axis of the widest spread (kept in ``dims[mid]``), smaller
coordinates before it, larger after, down to leaves of at most :data:`LEAF` entries. No node
objects, no pointers; a build is a sort-like pass, ~20x faster than bulk-loading an R-tree per
keyword (the ``rtree`` library it replaced), which is what let the window's parts of objects be
searched without paying for trees they use once.

Each node keeps the bounding box of its own entries (``box``, 48 bytes at one entry of the node:
:func:`_key`), and a search bounds a node by the distance to that box, as an R-tree does. The
split planes alone bound a node by its cell, and a cell spans whatever empty space lies beside its
entries: a query in a region whose objects had all expired (a window's refill) sat inside the
cells of far-away entries and walked most of a large keyword's tree (docs/window.md,
"Measured").

Points are ECEF unit vectors (:func:`knnmon.geo.unit_vectors`): the chord between two ranks like
their great-circle distance, so a Euclidean search is exact on the sphere with no pole or
antimeridian case. A search returns each query's ``want`` nearest by chord **and every entry tied
with the ``want``-th** (the caller ranks them by haversine distance and id).
"""

from __future__ import annotations

import numpy as np

from knnmon.jit import jit

__all__ = ["LEAF", "compile_kd", "kd_build", "kd_knn", "kd_refit"]

#: Entries of a leaf (scanned), at most.
LEAF = 8
#: Depth of the search's stack: 2 entries per level of a tree of up to 2^40 entries.
_STACK = 96


@jit
def _select(xyz: np.ndarray, rows: np.ndarray, dim: int, a: int, b: int, nth: int) -> None:
    """Order ``rows[a:b]`` so that ``rows[nth]`` holds the entry whose coordinate ``dim`` is the
    ``nth - a``-th smallest, none larger before it and none smaller after (Hoare's selection)."""
    lo, hi = a, b - 1
    while lo < hi:
        pivot = xyz[rows[(lo + hi) // 2], dim]
        i, j = lo, hi
        while i <= j:
            while xyz[rows[i], dim] < pivot:
                i += 1
            while xyz[rows[j], dim] > pivot:
                j -= 1
            if i <= j:
                rows[i], rows[j] = rows[j], rows[i]
                i += 1
                j -= 1
        if nth <= j:
            hi = j
        elif nth >= i:
            lo = i
        else:
            return


@jit
def _key(a, b):
    """Where the node ``[a, b)`` keeps its box: a leaf at its first entry, an inner node at its
    middle one (no two nodes share an entry)."""
    return a if b - a <= LEAF else (a + b) // 2


@jit
def _grow(xyz, rows, alive, a, b, lo0, hi0, lo1, hi1, lo2, hi2):
    """The box ``lo0, hi0, lo1, hi1, lo2, hi2`` grown to hold the live entries ``rows[a:b]``
    (``alive`` empty: all of them)."""
    for i in range(a, b):
        r = rows[i]
        if len(alive) and not alive[r]:
            continue
        x, y, z = xyz[r, 0], xyz[r, 1], xyz[r, 2]
        lo0, hi0 = min(lo0, x), max(hi0, x)
        lo1, hi1 = min(lo1, y), max(hi1, y)
        lo2, hi2 = min(lo2, z), max(hi2, z)
    return lo0, hi0, lo1, hi1, lo2, hi2


@jit
def kd_build(xyz: np.ndarray, rows: np.ndarray, dims: np.ndarray, box: np.ndarray, ptr: np.ndarray,
             codes: np.ndarray) -> None:
    """Order the posting lists of ``codes`` into k-d trees, in place.

    Parameters
    ----------
    xyz
        ``(n, 3)`` float64: the objects' unit vectors.
    rows
        ``(E,)`` int32: the posting lists, keyword ``c``'s at ``rows[ptr[c]:ptr[c + 1]]``
        (object rows); reordered in place.
    dims
        ``(E,)`` int8: written, each inner node's split axis at its middle entry.
    box
        ``(E, 6)`` float64: written, each node's bounding box ``lo0, hi0, lo1, hi1, lo2, hi2``
        at :func:`_key`.
    ptr
        ``(K + 1,)`` int64.
    codes
        ``(c,)`` int64: the keywords to build.
    """
    sa = np.empty(_STACK, dtype=np.int64)
    sb = np.empty(_STACK, dtype=np.int64)
    every = np.empty(0, dtype=np.bool_)
    for c in codes:
        top = 0
        sa[0], sb[0] = ptr[c], ptr[c + 1]
        top = 1
        while top:
            top -= 1
            a, b = sa[top], sb[top]
            if b <= a:
                continue
            lo0, hi0, lo1, hi1, lo2, hi2 = _grow(xyz, rows, every, a, b, np.inf, -np.inf, np.inf, -np.inf, np.inf,
                                                 -np.inf)
            k = _key(a, b)
            box[k, 0], box[k, 1], box[k, 2], box[k, 3], box[k, 4], box[k, 5] = lo0, hi0, lo1, hi1, lo2, hi2
            if b - a <= LEAF:
                continue
            dim = 0
            if hi1 - lo1 > hi0 - lo0:
                dim = 1
            if hi2 - lo2 > max(hi0 - lo0, hi1 - lo1):
                dim = 2
            mid = (a + b) // 2
            _select(xyz, rows, dim, a, b, mid)
            dims[mid] = dim
            sa[top], sb[top] = a, mid
            sa[top + 1], sb[top + 1] = mid + 1, b
            top += 2


@jit
def kd_refit(xyz: np.ndarray, rows: np.ndarray, box: np.ndarray, ptr: np.ndarray, built: np.ndarray,
             alive: np.ndarray, gone_lo: np.ndarray, gone_hi: np.ndarray, group_ptr: np.ndarray,
             group_codes: np.ndarray) -> tuple[int, int]:
    """Shrink node boxes to their live entries (``alive``: ``(n,)`` bool over the objects; a
    node with none gets an empty box, which no search enters), around the objects that expired
    since the last fit.

    They come in ``g`` groups of neighbours in space: group ``j``'s box is ``gone_lo[j]``,
    ``gone_hi[j]`` (``(g, 3)`` float64) and its objects' keyword codes are
    ``group_codes[group_ptr[j]:group_ptr[j + 1]]`` (int64, repeats allowed). Only those
    keywords' trees (if ``built``, ``(K,)`` bool) can hold one of them, and in each only the
    nodes whose box meets the group's box: those are visited, children first.

    Boxes only shrink as objects expire, and a box read half rewritten lies between the old and
    the new one: it still holds every live entry, so a search running meanwhile stays exact.
    Returns the nodes refitted (the fit's cost) and those of them left empty that were not (its
    yield: a search skips them now).
    """
    visits = emptied = 0
    sa = np.empty(3 * _STACK, dtype=np.int64)
    sb = np.empty(3 * _STACK, dtype=np.int64)
    done = np.empty(3 * _STACK, dtype=np.bool_)
    stamp = np.full(len(built), -1, dtype=np.int64)
    for g in range(len(gone_lo)):
        x0, x1, y0, y1 = gone_lo[g, 0], gone_hi[g, 0], gone_lo[g, 1], gone_hi[g, 1]
        z0, z1 = gone_lo[g, 2], gone_hi[g, 2]
        for c in group_codes[group_ptr[g]:group_ptr[g + 1]]:
            if not built[c] or stamp[c] == g:
                continue
            stamp[c] = g
            sa[0], sb[0], done[0] = ptr[c], ptr[c + 1], False
            top = 1
            while top:
                top -= 1
                a, b, children_done = sa[top], sb[top], done[top]
                if b <= a:
                    continue
                k = _key(a, b)
                if not children_done and (box[k, 0] > x1 or box[k, 1] < x0 or box[k, 2] > y1 or box[k, 3] < y0
                                          or box[k, 4] > z1 or box[k, 5] < z0):
                    continue  # none of this group's expired objects is under it
                lo0 = lo1 = lo2 = np.inf
                hi0 = hi1 = hi2 = -np.inf
                if b - a <= LEAF:
                    lo, hi = a, b
                elif not children_done:
                    mid = (a + b) // 2
                    sa[top], sb[top], done[top] = a, b, True
                    sa[top + 1], sb[top + 1], done[top + 1] = a, mid, False
                    sa[top + 2], sb[top + 2], done[top + 2] = mid + 1, b, False
                    top += 3
                    continue
                else:
                    mid = (a + b) // 2
                    lo, hi = mid, mid + 1
                    for j in (_key(a, mid), _key(mid + 1, b)):
                        lo0, hi0 = min(lo0, box[j, 0]), max(hi0, box[j, 1])
                        lo1, hi1 = min(lo1, box[j, 2]), max(hi1, box[j, 3])
                        lo2, hi2 = min(lo2, box[j, 4]), max(hi2, box[j, 5])
                lo0, hi0, lo1, hi1, lo2, hi2 = _grow(xyz, rows, alive, lo, hi, lo0, hi0, lo1, hi1, lo2, hi2)
                if lo0 > hi0 and box[k, 0] <= box[k, 1]:
                    emptied += 1
                box[k, 0], box[k, 1], box[k, 2], box[k, 3], box[k, 4], box[k, 5] = lo0, hi0, lo1, hi1, lo2, hi2
                visits += 1
    return visits, emptied


@jit
def _box_d2(box, k, qx, qy, qz):
    """Squared distance from the query to the box at ``k`` (0 inside). Each axis's gap is no
    larger than an entry's own difference on it, and the gaps are summed in :func:`_d2`'s
    order, so (rounding being monotone) it is never above an entry's squared chord as computed:
    no entry tied at the cut is pruned."""
    dx = box[k, 0] - qx if qx < box[k, 0] else (qx - box[k, 1] if qx > box[k, 1] else 0.0)
    dy = box[k, 2] - qy if qy < box[k, 2] else (qy - box[k, 3] if qy > box[k, 3] else 0.0)
    dz = box[k, 4] - qz if qz < box[k, 4] else (qz - box[k, 5] if qz > box[k, 5] else 0.0)
    return dx * dx + dy * dy + dz * dz


@jit
def _bound(box, a, b, qx, qy, qz):
    """The node ``[a, b)``'s lower bound on the squared chord: its box's (``inf`` if empty)."""
    return _box_d2(box, _key(a, b), qx, qy, qz) if b > a else np.inf


@jit
def _d2(xyz: np.ndarray, r: int, qx: float, qy: float, qz: float) -> float:
    dx, dy, dz = xyz[r, 0] - qx, xyz[r, 1] - qy, xyz[r, 2] - qz
    return dx * dx + dy * dy + dz * dz


@jit
def _expand(xyz, rows, dims, box, a, b, lb, qx, qy, qz, sa, sb, sl, top):
    """Visit the node ``[a, b)``: the entries to check now (a leaf's, or an inner node's middle
    one) and the new stack top, its children pushed with their boxes' squared distances, the
    farther first."""
    if b - a <= LEAF:
        return a, b, top
    mid = (a + b) // 2
    l, r = _bound(box, a, mid, qx, qy, qz), _bound(box, mid + 1, b, qx, qy, qz)
    if l <= r:
        sa[top], sb[top], sl[top] = mid + 1, b, r
        sa[top + 1], sb[top + 1], sl[top + 1] = a, mid, l
    else:
        sa[top], sb[top], sl[top] = a, mid, l
        sa[top + 1], sb[top + 1], sl[top + 1] = mid + 1, b, r
    return mid, mid + 1, top + 2


@jit
def _nearest_cut(xyz, rows, dims, box, alive, a0, b0, qx, qy, qz, want, bound, best, brow, sa, sb, sl):
    """The ``want`` nearest live entries of the tree ``rows[a0:b0]`` within squared chord
    ``bound``: their squared chords and rows in ``best[:n]``, ``brow[:n]`` (nearest first;
    ``n < want`` if it has fewer). Returns the ``want``-th smallest squared chord (``inf`` with
    fewer), ``n``, and whether an entry tied with it was left out (then :func:`_within` must
    gather the ties)."""
    nb = 0
    tie = False
    sa[0], sb[0], sl[0] = a0, b0, _bound(box, a0, b0, qx, qy, qz)
    top = 1
    while top:
        top -= 1
        a, b, lb = sa[top], sb[top], sl[top]
        if lb > bound or nb == want and lb > best[want - 1]:
            continue
        lo, hi, top = _expand(xyz, rows, dims, box, a, b, lb, qx, qy, qz, sa, sb, sl, top)
        for i in range(lo, hi):
            r = rows[i]
            if len(alive) and not alive[r]:
                continue
            d = _d2(xyz, r, qx, qy, qz)
            if d > bound:
                continue
            if nb < want:
                p = nb
                nb += 1
            elif d < best[want - 1]:
                p = want - 1
                if best[want - 2 if want > 1 else 0] == best[want - 1] and want > 1:
                    tie = True  # the evicted entry ties with the one that becomes the last
            else:
                if d == best[want - 1]:
                    tie = True
                continue
            while p > 0 and best[p - 1] > d:
                best[p] = best[p - 1]
                brow[p] = brow[p - 1]
                p -= 1
            best[p] = d
            brow[p] = r
    return (best[want - 1] if nb == want else np.inf), nb, tie


@jit
def _within(xyz, rows, dims, box, alive, a0, b0, qx, qy, qz, cut, out, at, sa, sb, sl) -> int:
    """The live entries of the tree ``rows[a0:b0]`` within squared chord ``cut`` of the query:
    written to ``out[at:]`` if ``out`` is not empty; returns how many."""
    n = 0
    sa[0], sb[0], sl[0] = a0, b0, _bound(box, a0, b0, qx, qy, qz)
    top = 1
    while top:
        top -= 1
        a, b, lb = sa[top], sb[top], sl[top]
        if lb > cut:
            continue
        lo, hi, top = _expand(xyz, rows, dims, box, a, b, lb, qx, qy, qz, sa, sb, sl, top)
        for i in range(lo, hi):
            r = rows[i]
            if len(alive) and not alive[r]:
                continue
            if _d2(xyz, r, qx, qy, qz) <= cut:
                if len(out):
                    out[at + n] = r
                n += 1
    return n


@jit
def kd_knn(xyz: np.ndarray, rows: np.ndarray, dims: np.ndarray, box: np.ndarray, ptr: np.ndarray, alive: np.ndarray,
           code: np.ndarray, q: np.ndarray, want: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each search ``g`` (a query and one of its keywords): the ``want[g]`` nearest live
    entries of keyword ``code[g]``'s tree to the point ``q[g]`` within squared chord
    ``bound[g]``, with every entry tied with the ``want[g]``-th (all of them if fewer).

    Parameters
    ----------
    xyz, rows, dims, box, ptr
        As :func:`kd_build` left them (``code``'s trees built).
    alive
        ``(n,)`` bool over the objects (only the live ones count), or empty: all live.
    code
        ``(g,)`` int64 keyword codes.
    q
        ``(g, 3)`` float64 unit vectors.
    want
        ``(g,)`` int64, each ``>= 1``.
    bound
        ``(g,)`` float64: only entries within this squared chord count (``inf``: all). A search
        over several parts of the objects passes the ``want``-th distance found in the parts
        searched before (:meth:`ObjectStore.knn_v`): nothing beyond it can be among the nearest.

    Returns
    -------
    counts : ``(g,)`` int64
    found : ``(sum(counts),)`` int64
        Object rows, search by search (in tree order, not by distance).
    """
    g = len(code)
    sa = np.empty(_STACK, dtype=np.int64)
    sb = np.empty(_STACK, dtype=np.int64)
    sl = np.empty(_STACK)
    top_want = max(1, want.max()) if g else 1
    best = np.empty(top_want)
    brow = np.empty(top_want, dtype=np.int64)
    cut = np.empty(g)
    tied = np.zeros(g, dtype=np.bool_)
    counts = np.zeros(g, dtype=np.int64)
    off = np.zeros(g + 1, dtype=np.int64)
    for j in range(g):
        off[j + 1] = off[j] + want[j]
    near = np.empty(off[g], dtype=np.int64)  # each search's nearest rows, unless it had ties
    none = np.empty(0, dtype=np.int64)
    for j in range(g):
        a, b = ptr[code[j]], ptr[code[j] + 1]
        qx, qy, qz = q[j, 0], q[j, 1], q[j, 2]
        cut[j], nb, tie = _nearest_cut(xyz, rows, dims, box, alive, a, b, qx, qy, qz, want[j], bound[j], best, brow, sa,
                                       sb, sl)
        if tie:  # rare: every entry tied with the want-th counts
            tied[j] = True
            counts[j] = _within(xyz, rows, dims, box, alive, a, b, qx, qy, qz, cut[j], none, 0, sa, sb, sl)
        else:
            counts[j] = nb
            near[off[j]:off[j] + nb] = brow[:nb]
    found = np.empty(counts.sum(), dtype=np.int64)
    at = 0
    for j in range(g):
        if tied[j]:
            a, b = ptr[code[j]], ptr[code[j] + 1]
            _within(xyz, rows, dims, box, alive, a, b, q[j, 0], q[j, 1], q[j, 2], cut[j], found, at, sa, sb, sl)
        else:
            found[at:at + counts[j]] = near[off[j]:off[j] + counts[j]]
        at += counts[j]
    return counts, found


def compile_kd() -> None:
    """Compile (or load from the cache) the kernels before the first search needs them."""
    xyz, rows = np.zeros((1, 3)), np.zeros(1, dtype=np.int32)
    ptr, codes = np.array([0, 1], dtype=np.int64), np.zeros(1, dtype=np.int64)
    box = np.zeros((1, 6))
    kd_build(xyz, rows, np.zeros(1, dtype=np.int8), box, ptr, codes)
    kd_refit(xyz, rows, box, ptr, np.ones(1, dtype=bool), np.ones(1, dtype=bool), np.zeros((1, 3)), np.zeros((1, 3)),
             np.array([0, 1], dtype=np.int64), codes)
    for alive in (np.zeros(0, dtype=bool), np.ones(1, dtype=bool)):
        kd_knn(xyz, rows, np.zeros(1, dtype=np.int8), box, ptr, alive, codes, np.zeros((1, 3)),
               np.ones(1, dtype=np.int64), np.full(1, np.inf))
