"""The routing table's lookup of a batch: each object's worker bitmask from its (object, keyword)
pairs in one compiled pass.

Per pair ``(object o in cell c, keyword code k)`` the workers are the OR of ``always[k]``, the
mask of the table's entry ``k * n_cells + c`` if there is one, and the masks of ``k``'s
rectangles holding ``c`` (:class:`~knnmon.assignment.routing.RoutingTable`). The entries are
sorted by key, so one keyword's entries are one contiguous range, and so are its rectangles
(sorted by code): :class:`CodeStarts` keeps where each keyword's range starts, and a pair's
binary search runs inside its keyword's range instead of over the whole table (millions of
entries at the paper's scale: fewer cache misses per pair).
"""

from __future__ import annotations

import numpy as np

from knnmon.assignment.routing_regions import KeywordRegions
from knnmon.jit import jit

__all__ = ["CodeStarts", "compile_lookup", "or_entries", "route_pairs"]


@jit
def _starts(codes_sorted_keys: np.ndarray, divisor: int, n_codes: int) -> np.ndarray:
    """``(n_codes + 1,)`` int64: where each code's run starts in ``keys // divisor`` (sorted)."""
    out = np.empty(n_codes + 1, dtype=np.int64)
    j = 0
    n = len(codes_sorted_keys)
    for c in range(n_codes + 1):
        while j < n and codes_sorted_keys[j] // divisor < c:
            j += 1
        out[c] = j
    return out


@jit
def _search(keys: np.ndarray, lo: int, hi: int, key: int) -> int:
    """Position of ``key`` in ``keys[lo:hi]`` (sorted), or ``-1``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(keys) and keys[lo] == key else -1


@jit
def _route(out, cells, owner, codes, always, n, n_cells, keys, masks, key_start, r_start, r_x0, r_y0, r_x1, r_y1,
           r_mask) -> None:
    """The kernel of :func:`route_pairs` (same arguments, unpacked)."""
    n_known = len(key_start) - 1
    for i in range(len(owner)):
        c = codes[i]
        if c < 0:
            continue
        o = owner[i]
        cell = cells[o]
        m = always[c]
        if c < n_known:
            at = _search(keys, key_start[c], key_start[c + 1], c * n_cells + cell)
            if at >= 0:
                m |= masks[at]
            x, y = cell % n, cell // n
            for j in range(r_start[c], r_start[c + 1]):
                if r_x0[j] <= x <= r_x1[j] and r_y0[j] <= y <= r_y1[j]:
                    m |= r_mask[j]
        out[o] |= m


@jit
def _or_entries(out, cells, owner, codes, n_cells, keys, masks) -> None:
    """The kernel of :func:`or_entries`."""
    for i in range(len(owner)):
        c = codes[i]
        if c >= 0:
            at = _search(keys, 0, len(keys), c * n_cells + cells[owner[i]])
            if at >= 0:
                out[owner[i]] |= masks[at]


class CodeStarts:
    """Where each keyword code's entries and rectangles start in a routing table's sorted arrays,
    recomputed when the table's ``keys`` or its rectangles' codes are other arrays than last time
    (a fold of the delta, a rebuild; the arrays are never sorted anew in place).

    Attributes
    ----------
    keys, rects : ``(K + 1,)`` int64 starts of code ``0..K`` (``K``: the codes known when they
        were computed; a later code has no entries and no rectangles in these arrays).
    """

    def __init__(self) -> None:
        self._of: tuple[object, object] | None = None
        self.keys = self.rects = np.zeros(1, dtype=np.int64)

    def of(self, keys: np.ndarray, rect_codes: np.ndarray, n_cells: int, n_codes: int) -> CodeStarts:
        """The starts for ``keys`` (``(p,)`` int64 sorted ``code * n_cells + cell``) and
        ``rect_codes`` (``(r,)`` int64 sorted), with ``n_codes`` the vocabulary's size."""
        if self._of is None or self._of[0] is not keys or self._of[1] is not rect_codes:
            self.keys = _starts(keys, n_cells, n_codes)
            self.rects = _starts(rect_codes, 1, n_codes)
            self._of = (keys, rect_codes)
        return self


def route_pairs(out: np.ndarray, cells: np.ndarray, owner: np.ndarray, codes: np.ndarray, always: np.ndarray,
                n: int, keys: np.ndarray, masks: np.ndarray, starts: CodeStarts, regions: KeywordRegions) -> None:
    """OR into ``out[owner[i]]`` the workers of pair ``i`` (module docstring) from ``always``,
    the sorted entries ``keys``/``masks`` and the rectangles ``regions``.

    Parameters
    ----------
    out
        ``(m,)`` uint64 worker bitmask per object, updated in place.
    cells
        ``(m,)`` int64 cell of each object, ``0 <= cell < n * n``.
    owner, codes
        ``(e,)`` int64: the object and keyword code of each pair; ``code < 0`` is skipped.
    always
        ``(K',)`` uint64, ``K' > max(codes)``.
    n
        Grid cells per side.
    starts
        :meth:`CodeStarts.of` these ``keys`` and ``regions.code``.
    """
    _route(out, cells, owner, codes, always, n, n * n, keys, masks, starts.keys, starts.rects, regions.x0,
           regions.y0, regions.x1, regions.y1, regions.mask)


def or_entries(out: np.ndarray, cells: np.ndarray, owner: np.ndarray, codes: np.ndarray, n_cells: int,
               keys: np.ndarray, masks: np.ndarray) -> None:
    """OR into ``out[owner[i]]`` the mask of entry ``codes[i] * n_cells + cells[owner[i]]`` of
    ``keys``/``masks`` (sorted; a small one: a binary search over all of it), if present;
    arguments as :func:`route_pairs`'s."""
    if len(keys):
        _or_entries(out, cells, owner, codes, n_cells, keys, masks)


def compile_lookup() -> None:
    """Compile (or load from numba's cache) the kernels before the first batch needs them."""
    one, bit = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.uint64)
    out = np.zeros(1, dtype=np.uint64)
    regions = KeywordRegions(one, one.astype(np.int32), one.astype(np.int32), one.astype(np.int32),
                             one.astype(np.int32), bit)
    route_pairs(out, one, one, one, bit, 1, one, bit, CodeStarts().of(one, regions.code, 1, 1), regions)
    or_entries(out, one, one, one, 1, one, bit)
