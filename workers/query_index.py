"""The worker's keyword-aware index over query regions: which queries may an object change?

An object can change ``kNN(q)`` only if it shares a keyword with ``q`` and lies within ``r_q``
(``SPEC.md``). A query's **region** is the bounding box of its kNN circle
(:func:`knnmon.geo.cap_bbox`); a batch of (object, keyword) pairs is answered with no Python
loop over objects or queries:

- **Grid inverted lists** (the paper's §4.4 layout, multi-level): level ``l`` (0..10) cuts the
  world ``[-180, 180] x [-90, 90]`` into ``2**(14 - l)`` squares per side (level 0: 0.022 deg x
  0.011 deg cells; level 10: 16 x 16). A query is listed under ``(level, keyword, cell)`` for each
  of at most 2 x 2 cells at the finest level where its region fits in so few. The lists are one
  sorted int64 key array with a CSR of query slots; a batch probes every level with one
  ``numpy.searchsorted``.
- **A 3-D R-tree** (``rtree``; longitude, latitude, keyword code) holds the few regions too
  large for level 10, continent-sized (e.g. ``r_q = inf``: fewer than ``k`` matches so far). It is bulk-loaded and
  probed with one ``intersection_v`` call per batch, only for pairs whose keyword it holds.

Regions shrink lazily: when ``r_q`` shrinks the old, larger entries stay (a superset, so no
candidate is missed) until :meth:`QueryIndex.rebuild`. Candidates are then checked exactly
against the current ``r_q`` by the worker.
"""

from __future__ import annotations

import numpy as np
from rtree import index as rtree_index

from knnmon.geo import cap_bbox
from knnmon.sorted_search import equal_range

__all__ = ["FINEST", "LEVELS", "QueryIndex"]

#: Grid levels 0..LEVELS-1; level l has 2**(FINEST - l) cells per side.
LEVELS = 11
FINEST = 14
_CELL_BITS = 2 * FINEST  # cell index at level 0 needs 28 bits
_CODE_BITS = 24


def _cells_per_side(level) -> np.ndarray:
    return np.left_shift(1, FINEST - np.asarray(level, dtype=np.int64))


def _cell_xy(lon, lat, level) -> tuple[np.ndarray, np.ndarray]:
    n = _cells_per_side(level)
    x = np.clip(np.floor((np.asarray(lon) + 180.0) / 360.0 * n), 0, n - 1).astype(np.int64)
    y = np.clip(np.floor((np.asarray(lat) + 90.0) / 180.0 * n), 0, n - 1).astype(np.int64)
    return x, y


def _key(level, code, x, y) -> np.ndarray:
    n = _cells_per_side(level)
    return ((np.asarray(level, dtype=np.int64) << (_CODE_BITS + _CELL_BITS))
            | (np.asarray(code, dtype=np.int64) << _CELL_BITS) | (y * n + x))


class QueryIndex:
    """Grid lists + R-tree over query regions (module docstring); slots are ints the worker owns.

    The grid lists are two aligned arrays, ``keys`` (int64, sorted, repeated per query) and
    ``slots``, so that :meth:`refresh` can replace the entries of a few queries in O(entries)
    without re-sorting. Keyword codes must be below ``2**24``.
    """

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.int64)
        self._slots = np.empty(0, dtype=np.int64)
        self._levels = np.zeros((0, LEVELS), dtype=np.int32)  # grid entries per (keyword code, level)
        self._tree: rtree_index.Index | None = None
        self._tree_codes = np.empty(0, dtype=np.int64)
        self._tree_slot = np.empty(0, dtype=np.int64)
        self._tree_entries: tuple[np.ndarray, ...] = (np.empty(0, np.int64), np.empty(0, np.int64),
                                                      *(np.empty(0) for _ in range(4)))

    @property
    def entries(self) -> int:
        """Number of grid entries plus R-tree entries."""
        return len(self._keys) + len(self._tree_slot)

    @staticmethod
    def _grid_entries(slot, code, lon, lat, radius_m):
        """``(keys, slots)`` of the grid entries (unsorted) and the big entries for the R-tree."""
        slot = np.asarray(slot, dtype=np.int64)
        code = np.asarray(code, dtype=np.int64)
        if len(code) and code.max() >= (1 << _CODE_BITS):
            raise ValueError(f"keyword codes must be below 2**{_CODE_BITS}")
        x0d, y0d, x1d, y1d = cap_bbox(lon, lat, radius_m)
        level = np.full(len(slot), LEVELS, dtype=np.int64)  # LEVELS = "too big for the grid"
        for lv in range(LEVELS - 1, -1, -1):
            ax0, ay0 = _cell_xy(x0d, y0d, lv)
            ax1, ay1 = _cell_xy(x1d, y1d, lv)
            level[(ax1 - ax0 <= 1) & (ay1 - ay0 <= 1)] = lv
        keys, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for lv in range(LEVELS):
            sel = np.flatnonzero(level == lv)
            if not len(sel):
                continue
            ax0, ay0 = _cell_xy(x0d[sel], y0d[sel], lv)
            ax1, ay1 = _cell_xy(x1d[sel], y1d[sel], lv)
            for dx in (0, 1):
                for dy in (0, 1):
                    ok = (ax0 + dx <= ax1) & (ay0 + dy <= ay1)
                    keys.append(_key(lv, code[sel][ok], ax0[ok] + dx, ay0[ok] + dy))
                    slots.append(slot[sel][ok])
        big = np.flatnonzero(level == LEVELS)
        return (np.concatenate(keys), np.concatenate(slots),
                (slot[big], code[big], x0d[big], y0d[big], x1d[big], y1d[big]))

    def _count_levels(self, keys: np.ndarray, sign: int) -> None:
        """Add ``sign`` per entry to the (keyword code, level) counts of grid ``keys``."""
        if not len(keys):
            return
        level = keys >> (_CODE_BITS + _CELL_BITS)
        code = (keys >> _CELL_BITS) & ((1 << _CODE_BITS) - 1)
        need = int(code.max()) + 1
        if need > len(self._levels):
            self._levels = np.vstack([self._levels, np.zeros((max(need, 2 * len(self._levels)) - len(self._levels),
                                                              LEVELS), dtype=np.int32)])
        np.add.at(self._levels, (code, level), sign)

    def _set_tree(self, slot, code, x0, y0, x1, y1) -> None:
        self._tree_entries = (slot, code, x0, y0, x1, y1)
        self._tree_slot, self._tree_codes = slot, np.unique(code)
        if len(slot):
            prop = rtree_index.Property()
            prop.dimension = 3
            c = code.astype(np.float64)
            self._tree = rtree_index.Index((np.arange(len(slot), dtype=np.int64), np.column_stack([x0, y0, c]),
                                            np.column_stack([x1, y1, c])), properties=prop)
        else:
            self._tree = None

    def rebuild(self, slot: np.ndarray, code: np.ndarray, lon: np.ndarray, lat: np.ndarray,
                radius_m: np.ndarray) -> None:
        """Index (query slot, keyword code) entries from scratch, regions from current radii.

        Parameters
        ----------
        slot, code
            ``(e,)`` int64: one entry per query and keyword.
        lon, lat, radius_m
            ``(e,)`` float64 per entry (the query's location in degrees and ``r_q`` in meters).
        """
        keys, slots, big = self._grid_entries(slot, code, lon, lat, radius_m)
        order = np.argsort(keys, kind="stable")
        self._keys, self._slots = keys[order], slots[order]
        self._levels[:] = 0
        self._count_levels(self._keys, 1)
        self._set_tree(*big)

    def refresh(self, changed: np.ndarray, slot: np.ndarray, code: np.ndarray, lon: np.ndarray, lat: np.ndarray,
                radius_m: np.ndarray) -> None:
        """Replace the entries of the queries ``changed`` (new, shrunk or removed) with the given
        ones (``slot``, ``code``, ... as in :meth:`rebuild`, only for those queries; none for a
        removed query). O(entries): a mask and one sorted insert, no re-sort."""
        changed = np.asarray(changed, dtype=np.int64)
        old = self._tree_entries
        size = max(int(a.max(initial=-1)) for a in (self._slots, changed, old[0])) + 1
        gone = np.zeros(size, dtype=bool)  # a mask, not np.isin: no sort of the O(entries) arrays
        gone[changed] = True
        keep = ~gone[self._slots]
        self._count_levels(self._keys[~keep], -1)
        keys, slots, big = self._grid_entries(slot, code, lon, lat, radius_m)
        self._count_levels(keys, 1)
        order = np.argsort(keys, kind="stable")
        base_k, base_s = self._keys[keep], self._slots[keep]
        pos = np.searchsorted(base_k, keys[order])
        self._keys, self._slots = np.insert(base_k, pos, keys[order]), np.insert(base_s, pos, slots[order])
        stay = ~gone[old[0]]
        if len(big[0]) or not stay.all():
            self._set_tree(*(np.concatenate([o[stay], b]) for o, b in zip(old, big)))

    def candidates(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray,
                   pair_code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate (object, query slot) pairs of a batch.

        Parameters
        ----------
        lon, lat
            ``(n,)`` float64 degrees of the batch's objects.
        pair_obj, pair_code
            ``(p,)`` int64: each (object, keyword code) pair of the batch.

        Returns
        -------
        obj, slot
            ``(c,)`` int64 pairs whose query region holds the object and shares the keyword (a
            superset of the pairs that can change a result). A query sharing several keywords
            with an object appears once per keyword.
        """
        objs, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        if len(self._keys) and len(pair_obj):
            # Probe a (pair, level) only where the pair's keyword has grid entries at that level.
            known = pair_code < len(self._levels)
            po, pcode = pair_obj[known], pair_code[known]
            at_level = self._levels[pcode] > 0  # (pairs, LEVELS)
            probes, owners = [], []
            for lv in np.flatnonzero(at_level.any(axis=0)).tolist():
                sel = np.flatnonzero(at_level[:, lv])
                o = po[sel]
                probes.append(_key(lv, pcode[sel], *_cell_xy(lon[o], lat[o], lv)))
                owners.append(o)
            probe = np.concatenate(probes) if probes else np.empty(0, np.int64)
            lo, hi = equal_range(self._keys, probe)
            n = hi - lo
            hit = np.flatnonzero(n)
            if len(hit):
                n = n[hit]
                owner = np.concatenate(owners)[hit]
                objs.append(np.repeat(owner, n))
                slots.append(self._slots[np.repeat(lo[hit] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))])
        if self._tree is not None and len(pair_obj):
            sel = np.flatnonzero(np.isin(pair_code, self._tree_codes))
            if len(sel):
                pts = np.column_stack([lon[pair_obj[sel]], lat[pair_obj[sel]], pair_code[sel].astype(np.float64)])
                ids, counts = self._tree.intersection_v(pts, pts)
                objs.append(np.repeat(pair_obj[sel], counts.astype(np.int64)))
                slots.append(self._tree_slot[ids])
        return np.concatenate(objs), np.concatenate(slots)
