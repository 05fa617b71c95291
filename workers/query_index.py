"""The worker's keyword-aware index over query regions: which queries may an object change?

An object can change ``kNN(q)`` only if it shares a keyword with ``q`` and lies within ``r_q``
(``docs/concepts.md``). A query's **region** is the bounding box of its kNN circle
(:func:`knnmon.geo.cap_bbox`); a batch of (object, keyword) pairs is answered with no Python
loop over objects or queries:

- **Grid inverted lists** (the paper's §4.4 layout, multi-level): level ``l`` (0..14) cuts the
  world ``[-180, 180] x [-90, 90]`` into ``2**(14 - l)`` squares per side (level 0: 0.022 deg x
  0.011 deg cells; level 10: 16 x 16; level 14: the whole world in one cell), numbered in
  Z-order (Morton), so a cell's parent is its number shifted right by 2. A query is listed under
  ``(level, keyword, cell)`` for each of at most 2 x 2 cells at the finest level where its
  region fits in so few. The lists are sorted int64 key arrays aligned with query slots (a base
  and a small delta); a batch probes only the levels where a pair's keyword has entries, all
  of them in one compiled pass per array (:func:`~knnmon.workers.kernels.grid_hits`).
- Every region fits: one that spans the world (``r_q = inf``, a query with fewer than ``k``
  matches so far, or a cap over a pole or across the 180th meridian) is listed at level 13 or
  14, so such a query is found by its keyword alone, with no spatial test.

When ``r_q`` shrinks, the worker re-indexes the query (:meth:`QueryIndex.refresh`): its new,
smaller entries go into the delta and its old ones are skipped until the next merge drops them;
a region still listed in the same cells (most shrinks) keeps its entries.
Candidates are then checked exactly against the current ``r_q`` by the worker.
"""

from __future__ import annotations

import numpy as np
from knnmon.arrays import with_capacity
from knnmon.geo import cap_bbox, unit_vectors
from knnmon.workers import kernels
from knnmon.workers.grid_runs import GridRun, PartedBase, merge_current

__all__ = ["FINEST", "LEVELS", "QueryIndex", "pretested", "unit_columns", "zorder"]

#: Grid levels 0..LEVELS-1; level l has 2**(FINEST - l) cells per side (the last: one cell).
LEVELS = 15
FINEST = 14
_CELL_BITS = 2 * FINEST  # cell index at level 0 needs 28 bits
_CODE_BITS = 24


def _cells0(lon, lat) -> tuple[np.ndarray, np.ndarray]:
    """Level-0 cell column and row (int64, clipped to the grid) of points in degrees. The cell
    at level ``l`` is ``(x >> l, y >> l)``: ``floor(u * 2**14) >> l == floor(u * 2**(14 - l))``
    exactly, since scaling by a power of two is exact in floating point."""
    n = 1 << FINEST
    x = np.clip(np.floor((np.asarray(lon) + 180.0) / 360.0 * n), 0, n - 1).astype(np.int64)
    y = np.clip(np.floor((np.asarray(lat) + 90.0) / 180.0 * n), 0, n - 1).astype(np.int64)
    return x, y


def _spread(v: np.ndarray) -> np.ndarray:
    """The 14 low bits of ``v`` moved to the even bit positions (for :func:`_morton`)."""
    v = v & 0x3FFF
    v = (v | (v << 8)) & 0x00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F
    v = (v | (v << 2)) & 0x33333333
    return (v | (v << 1)) & 0x55555555


def _morton(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Z-order index of cells (int64): bits of ``x`` and ``y`` interleaved. Hierarchical: the
    cell at level ``l`` of a level-0 cell ``m`` is ``m >> 2 * l``, so points sorted by their
    level-0 index are sorted at every level."""
    return _spread(x) | (_spread(y) << 1)


def zorder(lon, lat) -> np.ndarray:
    """The level-0 grid cell of points (degrees) as its Z-order (Morton) index, ``(n,)`` int64:
    sorting by it sorts the points along the Z curve at every level (the R-tree's packing order
    uses it too, :mod:`knnmon.workers.packed_rtree`)."""
    return _morton(*_cells0(lon, lat))


def unit_columns(lon, lat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unit vectors of points in degrees (:func:`knnmon.geo.unit_vectors`) as three
    contiguous ``(n,)`` float64 columns, as the pre-test takes them."""
    u = unit_vectors(lon, lat)
    return tuple(np.ascontiguousarray(u[:, i]) for i in range(3))


def pretested(lon, lat, obj: np.ndarray, slot: np.ndarray, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(obj, slot)`` (``(c,)`` int64) that pass :func:`~knnmon.workers.kernels.chord_pretest`
    (objects at ``lon``, ``lat`` degrees; ``reach``: ``(Q, 4)`` per slot)."""
    sel = kernels.chord_pretest(*unit_columns(lon, lat), obj, slot, reach)
    return obj[sel], slot[sel]


def _key(level, code, cell) -> np.ndarray:
    """Grid key: level, keyword code, and the cell's Z-order index at that level."""
    return ((np.asarray(level, dtype=np.int64) << (_CODE_BITS + _CELL_BITS))
            | (np.asarray(code, dtype=np.int64) << _CELL_BITS) | cell)


class QueryIndex:
    """Grid lists over query regions (module docstring); slots are ints the worker owns.

    The grid lists are sorted runs of aligned arrays (:class:`~knnmon.workers.grid_runs.GridRun`):
    a large **base**, a **middle** run and a small **delta** (a three-level log-structured merge).
    Re-indexing a query (:meth:`refresh`) bumps its generation and merges its new entries into
    the delta only; its older entries stay in place, superseded, and :meth:`candidates` skips
    entries whose generation is not their slot's current one. When the delta reaches
    ``DELTA_MIN`` entries it moves into the middle run; when the middle run reaches
    ``max(DELTA_MIN, base / DELTA_SHARE)``, it is folded into the base one key-range part per
    refresh (:class:`~knnmon.workers.grid_runs.PartedBase`), and until the fold ends the probes
    skip its entries already folded. Every merge is one compiled pass that drops the superseded
    entries it meets (:func:`~knnmon.workers.grid_runs.merge_current`). A refresh thus costs
    O(delta + one part), not O(all entries), and a large base (a million queries) does not make
    every refresh copy a large delta. Keyword
    codes must be below ``2**24``.
    """

    #: The delta moves into the middle run at ``DELTA_MIN`` entries; the middle run is folded into
    #: the base when it holds at least ``max(DELTA_MIN, len(base) // DELTA_SHARE)``, one base part
    #: of about ``PART_ENTRIES`` entries per refresh.
    DELTA_SHARE = 16
    DELTA_MIN = 1 << 16
    PART_ENTRIES = 1 << 16

    def __init__(self) -> None:
        self._base = PartedBase(GridRun.empty(), self.PART_ENTRIES)
        self._folding = -1  # the next base part to fold the middle run into; -1: no fold under way
        self._mid = GridRun.empty()
        self._delta = GridRun.empty()
        self._gen = np.zeros(0, dtype=np.int32)  # per slot: the generation of its current entries
        self._covers = np.zeros(0, dtype=np.int64)  # per slot: its entries' packed cover + 1 (0: none)
        self._levels = np.zeros((0, LEVELS), dtype=np.int32)  # grid entries per (keyword code, level)
        self.compactions = 0
        self.found = 0  # candidate pairs the last :meth:`candidates` found (before its pre-test)

    @property
    def entries(self) -> int:
        """Number of grid entries (superseded ones not yet merged away included)."""
        return len(self._base) + len(self._mid) + len(self._delta)

    def _cover(self, lon, lat, radius_m) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Per region: the level and the level's cell columns and rows ``(ax0, ay0, ax1, ay1)``
        of its bounding box (``(e,)`` int64 each; at most 2 x 2 cells: the class docstring), and
        all five packed in one int64 (two regions with one packed value are listed alike)."""
        x0d, y0d, x1d, y1d = cap_bbox(lon, lat, radius_m)
        bx0, by0 = _cells0(x0d, y0d)
        bx1, by1 = _cells0(x1d, y1d)
        level = np.full(len(bx0), LEVELS - 1, dtype=np.int64)  # the last level's one cell holds any region
        for lv in range(LEVELS - 2, -1, -1):
            level[((bx1 >> lv) - (bx0 >> lv) <= 1) & ((by1 >> lv) - (by0 >> lv) <= 1)] = lv
        ax0, ay0, ax1, ay1 = bx0 >> level, by0 >> level, bx1 >> level, by1 >> level
        packed = (level << (4 * FINEST)) | (ax0 << (3 * FINEST)) | (ay0 << (2 * FINEST)) | (ax1 << FINEST) | ay1
        return (level, ax0, ay0, ax1, ay1), packed

    def _grid_entries(self, slot, code, cover: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, slots)`` ``(e,)`` int64 of the grid entries of the given entries (``slot``,
        ``code``, each region's :meth:`_cover`), unsorted."""
        slot = np.asarray(slot, dtype=np.int64)
        code = np.asarray(code, dtype=np.int64)
        if len(code) and code.max() >= (1 << _CODE_BITS):
            raise ValueError(f"keyword codes must be below 2**{_CODE_BITS}")
        level, ax0, ay0, ax1, ay1 = cover
        keys, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for dx in (0, 1):
            for dy in (0, 1):
                ok = (ax0 + dx <= ax1) & (ay0 + dy <= ay1)
                keys.append(_key(level[ok], code[ok], _morton(ax0[ok] + dx, ay0[ok] + dy)))
                slots.append(slot[ok])
        return np.concatenate(keys), np.concatenate(slots)

    def _count_levels(self, keys: np.ndarray, sign: int) -> None:
        """Add ``sign`` per grid key to the (keyword code, level) table that :meth:`candidates`
        uses to skip levels. Superseded entries count until a merge drops them (at worst a
        wasted probe)."""
        if not len(keys):
            return
        group, n = np.unique(keys >> _CELL_BITS, return_counts=True)  # (level, code) per key
        level = group >> _CODE_BITS
        code = group & ((1 << _CODE_BITS) - 1)
        self._levels = with_capacity(self._levels, int(code.max()) + 1)
        self._levels[code, level] += sign * n.astype(np.int32)

    def _merged(self, a: GridRun, b: GridRun) -> GridRun:
        """``a`` and ``b`` merged without their superseded entries (uncounted from the level
        table): :func:`~knnmon.workers.grid_runs.merge_current`."""
        return merge_current(a, b, self._gen, self._levels, _CELL_BITS, _CODE_BITS)

    def _fold_step(self) -> None:
        """Fold the middle run's entries of the next base part into it (dropping superseded
        entries); after the last part, the middle run is empty and a merge is counted."""
        i, base, mid = self._folding, self._base, self._mid
        lo, hi = np.searchsorted(mid.keys, [base.lows[i], base.high(i)], "left")
        self._folding += base.fold(i, GridRun(mid.keys[lo:hi], mid.slots[lo:hi], mid.gens[lo:hi]), self._merged)
        if self._folding >= len(base.parts):
            self._mid, self._folding = GridRun.empty(), -1
            self.compactions += 1

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
        cover, packed = self._cover(lon, lat, radius_m)
        keys, slots = self._grid_entries(slot, code, cover)
        order = np.argsort(keys, kind="stable")
        self._gen = with_capacity(self._gen, int(np.max(slot, initial=-1)) + 1)
        self._gen[:] = 0
        self._covers = with_capacity(self._covers, len(self._gen))
        self._covers[:] = 0
        self._covers[np.asarray(slot, dtype=np.int64)] = packed + 1
        self._base = PartedBase(GridRun(keys[order], slots[order], np.zeros(len(keys), np.int32)),
                                self.PART_ENTRIES)
        self._mid, self._delta, self._folding = GridRun.empty(), GridRun.empty(), -1
        self._levels[:] = 0
        self._count_levels(keys, 1)

    def refresh(self, changed: np.ndarray, slot: np.ndarray, code: np.ndarray, lon: np.ndarray, lat: np.ndarray,
                radius_m: np.ndarray) -> None:
        """Replace the entries of the queries ``changed`` (new, shrunk, grown or removed) with
        the given ones (``slot``, ``code``, ... as in :meth:`rebuild`, only for those queries; none
        for a removed query). A query whose new region is listed in the same cells as its indexed
        one keeps its entries (most shrinks: 110,825 of 122,994 in ``knnmon run --window 500s``).
        O(delta + changed entries): see the class docstring."""
        changed, slot = np.asarray(changed, dtype=np.int64), np.asarray(slot, dtype=np.int64)
        n = int(max(changed.max(initial=-1), slot.max(initial=-1))) + 1
        self._gen, self._covers = with_capacity(self._gen, n), with_capacity(self._covers, n)
        cover, packed = self._cover(lon, lat, radius_m)
        same = np.zeros(len(self._covers), dtype=bool)
        same[slot] = self._covers[slot] == packed + 1  # (a slot's entries share its region)
        new = ~same[slot]
        changed = changed[~same[changed]]
        self._covers[changed] = 0
        self._covers[slot] = packed + 1
        if len(changed):
            keys, slots = self._grid_entries(slot[new], np.asarray(code)[new], tuple(c[new] for c in cover))
            self._gen[changed] += 1
            self._count_levels(keys, 1)
            order = np.argsort(keys, kind="stable")
            self._delta = self._merged(self._delta, GridRun(keys[order], slots[order], self._gen[slots[order]]))
        if self._folding < 0 and len(self._delta) >= self.DELTA_MIN:
            self._mid, self._delta = self._merged(self._mid, self._delta), GridRun.empty()
            if len(self._mid) >= max(self.DELTA_MIN, len(self._base) // self.DELTA_SHARE):
                self._folding = 0
        steps = 0
        while self._folding >= 0 and (steps == 0 or len(self._delta) >= 4 * self.DELTA_MIN):
            self._fold_step()  # (more than one if the delta has grown large meanwhile)
            steps += 1

    def _grid_hits(self, probe: np.ndarray, owner: np.ndarray, within: tuple[np.ndarray, ...] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``(owner, slot)`` ``(h,)`` int64 for every current grid entry whose key equals a probe
        (``probe``, ``owner``: ``(m,)`` int64 keys, sorted or not, and the object each belongs to);
        with ``within`` (the objects' unit vectors and the slots' ``reach``, as
        :func:`~knnmon.workers.kernels.chord_pretest` takes them) only the pairs that pass its
        pre-test. :attr:`found` counts them all."""
        objs, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        self.found = 0
        f0 = np.empty(0)
        test = (f0, f0, f0, np.empty((0, 4)), False) if within is None else (*within, True)
        if len(probe) > 1 and (probe[1:] < probe[:-1]).any():  # (each part takes the probes in its range)
            order = np.argsort(probe, kind="stable")
            probe, owner = probe[order], owner[order]
        base = self._base
        cuts = np.r_[0, np.searchsorted(probe, base.lows[1:], "left"), len(probe)]
        # (run, its probes from, to, the key below which it is skipped: the middle run folded so far)
        runs = [(p, cuts[i], cuts[i + 1], None) for i, p in enumerate(base.parts) if len(p) and cuts[i + 1] > cuts[i]]
        for run in (self._mid, self._delta):
            if len(run):
                skip = base.lows[self._folding] if run is self._mid and self._folding > 0 else None
                runs.append((run, 0, len(probe), skip))
        for run, a, b, skip in runs:
            ukeys, ustart = run.distinct
            if skip is not None:
                u0 = int(np.searchsorted(ukeys, skip, "left"))
                ukeys, ustart = ukeys[u0:], ustart[u0:]
            o, s, hits = kernels.grid_hits(probe[a:b], owner[a:b], ukeys, ustart, run.slots, run.gens, self._gen,
                                           *test)
            self.found += hits
            objs.append(o)
            slots.append(s)
        return np.concatenate(objs), np.concatenate(slots)

    def candidates(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray,
                   reach: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Candidate (object, query slot) pairs of a batch.

        Parameters
        ----------
        lon, lat
            ``(n,)`` float64 degrees of the batch's objects.
        pair_obj, pair_code
            ``(p,)`` int64: each (object, keyword code) pair of the batch.
        reach
            ``(Q, 4)`` float64 per slot (the worker's ``QueryTable.reach``): only the pairs that
            pass :func:`~knnmon.workers.kernels.chord_pretest` are returned, tested as they are
            found (default: every pair). Every index takes it so.

        Returns
        -------
        obj, slot
            ``(c,)`` int64 pairs whose query region holds the object and shares the keyword (a
            superset of the pairs that can change a result). A query sharing several keywords
            with an object appears once per keyword. :attr:`found` counts them before the
            pre-test.
        """
        self.found = 0
        if not (self.entries and len(pair_obj)):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        # Probe a (pair, level) only where the pair's keyword has grid entries at that level.
        # Pairs sorted by (code, Z-order cell) give probes sorted within each level, and the
        # levels come in increasing order: the probes are sorted with no sort of their own.
        known = pair_code < len(self._levels)
        po, pcode = pair_obj[known], pair_code[known]
        cell = _morton(*_cells0(lon, lat))[po]
        order = np.argsort((pcode << _CELL_BITS) | cell, kind="stable")
        po, pcode, cell = po[order], pcode[order], cell[order]
        at_level = self._levels[pcode] > 0  # (pairs, LEVELS)
        probes, owners = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for lv in np.flatnonzero(at_level.any(axis=0)).tolist():
            sel = np.flatnonzero(at_level[:, lv])
            probes.append(_key(lv, pcode[sel], cell[sel] >> (2 * lv)))
            owners.append(po[sel])
        within = None if reach is None else (*unit_columns(lon, lat), reach)
        return self._grid_hits(np.concatenate(probes), np.concatenate(owners), within)
