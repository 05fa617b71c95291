"""The routing table's ``(keyword, cell)`` entries of many query regions at once, each distinct
entry once with the OR of its workers' bits, by a compiled kernel.

A query's region is a rectangle of grid cells (its MBR of radius ``r_q``); it is routed for each
of its keywords (:class:`~knnmon.assignment.routing.RoutingTable`, after the paper's Section 4.2
"routing"). Many regions overlap: after a window's expiry, thousands of queries of one area are
refilled together with large, nearly equal regions (docs/window.md, "Refill waves"). Expanding
every rectangle and sorting all the cells costs their sort; painting them on one grid per keyword
costs each cell once and sorts only the distinct ones.
"""

from __future__ import annotations

import numpy as np

from knnmon.jit import jit

__all__ = ["compile_region_entries", "region_entries"]


@jit
def _paint(code, x0, y0, x1, y1, bit, n, n_cells, cell_mask, touched, out_key, out_mask) -> int:
    """One pass over the pairs (sorted by code): per code, OR each pair's bit into the cells of
    its rectangle; write the distinct cells' entries (sorted) when ``out_key`` is not empty.
    Returns how many entries there are."""
    m, o, i = len(code), 0, 0
    while i < m:
        g = i
        nt = 0
        while g < m and code[g] == code[i]:
            for y in range(y0[g], y1[g] + 1):
                for x in range(x0[g], x1[g] + 1):
                    c = y * n + x
                    if cell_mask[c] == 0:
                        touched[nt] = c
                        nt += 1
                    cell_mask[c] |= bit[g]
            g += 1
        cells = np.sort(touched[:nt])
        for j in range(nt):
            c = cells[j]
            if len(out_key):
                out_key[o] = code[i] * n_cells + c
                out_mask[o] = cell_mask[c]
            cell_mask[c] = 0
            o += 1
        i = g
    return o


def region_entries(code: np.ndarray, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray,
                   bit: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The entries of ``p`` (keyword, region) pairs: pair ``i`` routes keyword code ``code[i]``
    in cells ``[x0[i], x1[i]] x [y0[i], y1[i]]`` (inclusive, of an ``n x n`` grid) to the
    workers of ``bit[i]``.

    Parameters
    ----------
    code, x0, y0, x1, y1
        ``(p,)`` int64; ``0 <= x0 <= x1 < n``, the same for ``y``.
    bit
        ``(p,)`` uint64, nonzero.
    n
        Cells per side of the grid.

    Returns
    -------
    keys : ``(e,)`` int64
        ``code * n * n + cell`` (``cell = y * n + x``), sorted, unique.
    masks : ``(e,)`` uint64
        The OR of the bits of the pairs covering each key.
    """
    order = np.argsort(code, kind="stable")
    args = [np.ascontiguousarray(a[order], dtype=np.int64) for a in (code, x0, y0, x1, y1)]
    bits = np.ascontiguousarray(np.asarray(bit)[order], dtype=np.uint64)
    cell_mask = np.zeros(n * n, dtype=np.uint64)
    touched = np.empty(n * n, dtype=np.int64)
    none_k, none_m = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
    e = _paint(*args, bits, n, n * n, cell_mask, touched, none_k, none_m)
    keys, masks = np.empty(e, dtype=np.int64), np.empty(e, dtype=np.uint64)
    _paint(*args, bits, n, n * n, cell_mask, touched, keys, masks)
    return keys, masks


def compile_region_entries() -> None:
    """Compile (or load from numba's cache) the kernel before the first batch needs it."""
    one = np.zeros(1, dtype=np.int64)
    region_entries(one, one, one, one, one, np.ones(1, dtype=np.uint64), 1)
