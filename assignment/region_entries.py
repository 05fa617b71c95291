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

from knnmon.arrays import runs
from knnmon.jit import jit

__all__ = ["compile_region_entries", "merge_entries", "merge_sorted", "region_entries", "withdraw"]


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


def withdraw(keys: np.ndarray, masks: np.ndarray, codes: np.ndarray, bit: np.uint64, keep: np.ndarray,
             n_cells: int) -> int:
    """Clear ``bit`` from the entries of keyword ``codes`` whose key is not in ``keep``, in place.

    Parameters
    ----------
    keys, masks
        ``(p,)`` int64 sorted unique ``code * n_cells + cell`` keys and their ``(p,)`` uint64
        worker bits (one of the routing table's sorted stores).
    codes
        ``(c,)`` int64 keyword codes, unique.
    bit
        The worker's bit.
    keep
        ``(e,)`` int64 sorted unique keys where the bit stays.

    Returns
    -------
    How many entries lost the bit.
    """
    if not len(keys) or not len(codes):
        return 0
    codes = np.asarray(codes, dtype=np.int64)
    lo = np.searchsorted(keys, codes * n_cells)
    hi = np.searchsorted(keys, (codes + 1) * n_cells)
    at = runs(lo, hi - lo)
    if len(keep):
        pos = np.minimum(np.searchsorted(keep, keys[at]), len(keep) - 1)
        at = at[keep[pos] != keys[at]]
    at = at[(masks[at] & bit) != 0]
    masks[at] &= ~bit
    return len(at)

#: Keys below this leave 6 bits for a worker's number in one int64 (:func:`merge_entries`).
_PACKABLE_KEY = 1 << 57
#: Worker ``w``'s bit, by ``w``.
_BITS = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))


def merge_entries(key_parts: list, bit_parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys ``(p,)`` int64 and the OR of their bits ``(p,)`` uint64.

    Each part's bits are one worker's bit (the routing table's build:
    :func:`~knnmon.assignment.routing._append_entries`), so key and worker pack into one int64
    (``key << 6 | worker``) and one plain sort orders them (no argsort, no scattered OR); other
    parts, or keys too large to pack, take ``np.unique``'s way."""
    keys = np.concatenate(key_parts) if key_parts else np.empty(0, dtype=np.int64)
    if not len(keys):
        return keys, np.empty(0, dtype=np.uint64)
    workers = []
    for k, b in zip(key_parts, bit_parts):
        w = int(b[0]).bit_length() - 1 if len(b) else 0
        if len(b) and not (int(b[0]) == 1 << w and (b == b[0]).all()):
            break  # not one worker's bit throughout
        workers.append(np.full(len(k), w, dtype=np.int64))
    else:
        if int(keys.min()) >= 0 and int(keys.max()) < _PACKABLE_KEY:
            packed = np.sort((keys << 6) | np.concatenate(workers))
            key = packed >> 6
            first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
            return key[first], np.bitwise_or.reduceat(_BITS[packed & 63], first)
    keys, inv = np.unique(keys, return_inverse=True)
    masks = np.zeros(len(keys), dtype=np.uint64)
    np.bitwise_or.at(masks, inv, np.concatenate(bit_parts))
    return keys, masks


def merge_sorted(keys: np.ndarray, masks: np.ndarray, new_keys: np.ndarray,
                  new_masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted tables of unique keys ``(p,)`` int64 with their bits ``(p,)`` uint64 merged
    into one (a key in both: its bits OR-ed), in O(p) copies and O(m log p) searches, where
    sorting the two together (:func:`merge_entries`) costs O(p log p)."""
    if not len(new_keys):
        return keys, masks
    pos = np.searchsorted(keys, new_keys)
    held = np.flatnonzero(pos < len(keys))
    held = held[keys[pos[held]] == new_keys[held]]
    masks = masks.copy()
    masks[pos[held]] |= new_masks[held]
    fresh = np.ones(len(new_keys), dtype=bool)
    fresh[held] = False
    at = pos[fresh] + np.arange(int(fresh.sum()))  # where each fresh key lands in the merged table
    mine = np.ones(len(keys) + len(at), dtype=bool)
    mine[at] = False
    out_k = np.empty(len(mine), dtype=np.int64)
    out_m = np.empty(len(mine), dtype=np.uint64)
    out_k[at], out_m[at] = new_keys[fresh], new_masks[fresh]
    out_k[mine], out_m[mine] = keys, masks
    return out_k, out_m
