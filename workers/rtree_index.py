"""The worker's R-tree query index (``workers.index rtree``).

The design card's "local batched R-tree search": the queries' kNN-region MBRs (the bounding box
of each query's ``r_q`` circle, :func:`knnmon.geo.cap_bbox`) in a keyword-aware packed R-tree
(:class:`~knnmon.workers.packed_rtree.PackedRTree`: keyword code as a third dimension), one entry
per (query, keyword). A batch's (object, keyword) pairs are searched together, vectorised, from
each keyword's entry points down to the entries (:meth:`RTreeIndex.candidates`). A batch's
results are released together, so Wang, Zhang and Kitsuregawa's Short-Job-First order within a
batch (BatchSearch) gains nothing here (docs/batching.md).

**Updates** (a two-level log, like the grid's): a large base tree and a small delta tree (rebuilt
on each refresh: small), merged when the delta's entries plus the superseded ones still in the
trees reach ``max(DELTA_MIN, base / DELTA_SHARE)`` (a superseded entry is skipped, but its box,
often the large one of a region that since shrank, still costs tests: counting them bounds it). Each query slot has a generation; re-indexing a query bumps it and puts its new entries
in the delta, and entries of older generations are skipped. A region that **shrinks** is
re-indexed lazily: only once its box's area is below ``SHRINK`` of the indexed box (until then
the indexed box is a superset, and the worker checks every candidate against the exact ``r_q``).
A region that grows (a window's expiry) or moves is re-indexed at once.
"""

from __future__ import annotations

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.geo import cap_bbox
from knnmon.workers.packed_rtree import PackedRTree
from knnmon.workers.query_index import pretested

__all__ = ["RTreeIndex"]


class _Part:
    """One packed tree with its entries' slots and generations (tree order)."""

    def __init__(self, slot, gen, code, x0, y0, x1, y1, fanout: int) -> None:
        self.tree = PackedRTree(x0, y0, x1, y1, code, fanout=fanout)
        o = self.tree.order
        self.slot, self.gen = np.asarray(slot, np.int64)[o], np.asarray(gen, np.int32)[o]

    def __len__(self) -> int:
        return len(self.slot)

    def columns(self, keep: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(slot, gen, code, x0, y0, x1, y1)`` of the entries ``keep`` (a mask, tree order)."""
        b = self.tree.entry_boxes[keep]
        return self.slot[keep], self.gen[keep], self.tree.entry_codes[keep], b[:, 0], b[:, 1], b[:, 2], b[:, 3]

    @classmethod
    def empty(cls, fanout: int) -> _Part:
        z = np.empty(0)
        return cls(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int64), z, z, z, z, fanout)


class RTreeIndex:
    """Keyword-aware R-tree over query regions (module docstring).

    The same interface as :class:`~knnmon.workers.query_index.QueryIndex` (``rebuild``,
    ``refresh``, ``candidates``, ``entries``), so a worker runs either.

    Parameters
    ----------
    fanout
        Entries per leaf and children per node.
    """

    DELTA_SHARE = 8
    DELTA_MIN = 1 << 13
    #: A shrunk region is re-indexed once its box's area is below this share of the indexed box.
    SHRINK = 0.25

    def __init__(self, *, fanout: int = 4) -> None:
        self.fanout = int(fanout)
        self._base = _Part.empty(self.fanout)
        self._delta = _Part.empty(self.fanout)
        self._gen = np.zeros(0, dtype=np.int32)
        self._ibox = np.zeros((0, 4))  # per slot: its indexed box (current generation)
        self._nent = np.zeros(0, dtype=np.int64)  # per slot: its current entries (0: not indexed)
        self._stale = 0  # entries superseded since the last merge (still in the trees)
        self.compactions = 0
        self.found = 0  # candidate pairs the last :meth:`candidates` found

    @property
    def entries(self) -> int:
        """Entries held (superseded ones not yet merged away included)."""
        return len(self._base) + len(self._delta)

    def _grow(self, n: int) -> None:
        self._gen = with_capacity(self._gen, n)
        self._ibox = with_capacity(self._ibox, n)
        self._nent = with_capacity(self._nent, n)

    def rebuild(self, slot: np.ndarray, code: np.ndarray, lon: np.ndarray, lat: np.ndarray,
                radius_m: np.ndarray) -> None:
        """Index (query slot, keyword code) entries from scratch.

        Parameters
        ----------
        slot, code
            ``(e,)`` int64: one entry per query and keyword.
        lon, lat, radius_m
            ``(e,)`` float64 per entry: the query's location (degrees) and ``r_q`` (meters).
        """
        slot = np.asarray(slot, dtype=np.int64)
        x0, y0, x1, y1 = cap_bbox(lon, lat, radius_m)
        self._grow(int(slot.max(initial=-1)) + 1)
        self._gen[:] = 0
        self._nent[:] = 0
        np.add.at(self._nent, slot, 1)
        self._stale = 0
        self._ibox[slot] = np.column_stack([x0, y0, x1, y1])
        self._base = _Part(slot, np.zeros(len(slot), np.int32), code, x0, y0, x1, y1, self.fanout)
        self._delta = _Part.empty(self.fanout)

    def refresh(self, changed: np.ndarray, slot: np.ndarray, code: np.ndarray, lon: np.ndarray, lat: np.ndarray,
                radius_m: np.ndarray) -> None:
        """Replace the entries of the queries ``changed`` (new, shrunk, grown or removed) with
        the given ones (arrays as in :meth:`rebuild`, only for those queries; none for a removed
        query). A shrink that keeps at least ``SHRINK`` of the indexed box's area is skipped."""
        changed = np.asarray(changed, dtype=np.int64)
        slot = np.asarray(slot, dtype=np.int64)
        self._grow(int(max(changed.max(initial=-1), slot.max(initial=-1))) + 1)
        x0, y0, x1, y1 = cap_bbox(lon, lat, radius_m)
        new_box = np.column_stack([x0, y0, x1, y1])
        has = np.zeros(len(self._gen), dtype=bool)
        has[slot] = True
        removed = np.unique(changed[~has[changed]])
        self._gen[removed] += 1
        self._stale += int(self._nent[removed].sum())
        self._nent[removed] = 0
        # Per slot with entries: keep its indexed entries if the new box lies inside and is not much smaller.
        old = self._ibox[slot]
        inside = ((old[:, 0] <= x0) & (old[:, 1] <= y0) & (x1 <= old[:, 2]) & (y1 <= old[:, 3])
                  & (self._nent[slot] > 0))
        area_new = (x1 - x0) * (y1 - y0)
        area_old = (old[:, 2] - old[:, 0]) * (old[:, 3] - old[:, 1])
        lazy = inside & (area_new >= self.SHRINK * area_old)
        skip = np.zeros(len(self._gen), dtype=bool)
        skip[slot[lazy]] = True  # all entries of a slot share its box: the same answer per slot
        take = ~skip[slot]
        if take.any():
            moved = np.unique(slot[take])
            self._gen[moved] += 1
            self._stale += int(self._nent[moved].sum())
            self._nent[moved] = 0
            np.add.at(self._nent, slot[take], 1)
            self._ibox[slot[take]] = new_box[take]
        if not len(removed) and not take.any():
            return
        current = self._delta.gen == self._gen[self._delta.slot]
        kept = self._delta.columns(current)
        fresh = (slot[take], self._gen[slot[take]], np.asarray(code, np.int64)[take], x0[take], y0[take],
                 x1[take], y1[take])
        cols = tuple(np.concatenate([a, b]) for a, b in zip(kept, fresh))
        if len(cols[0]) + self._stale >= max(self.DELTA_MIN, len(self._base) // self.DELTA_SHARE):
            base_cur = self._base.gen == self._gen[self._base.slot]
            cols = tuple(np.concatenate([a, b]) for a, b in zip(self._base.columns(base_cur), cols))
            self._base = _Part(*cols, self.fanout)
            self._delta = _Part.empty(self.fanout)
            self._stale = 0
            self.compactions += 1
        else:
            self._delta = _Part(*cols, self.fanout)

    def _points(self, lon, lat, pair_obj, pair_code):
        po = np.asarray(pair_obj, dtype=np.int64)
        return (po, np.asarray(lon, np.float64)[po], np.asarray(lat, np.float64)[po],
                np.asarray(pair_code, dtype=np.int64))

    def _hits(self, part: _Part, pair: np.ndarray, node: np.ndarray, po: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """(object, slot) of frontier pairs at the entries of ``part``, superseded ones skipped."""
        s = part.slot[node]  # node: entry positions in tree order, as the part's columns
        cur = part.gen[node] == self._gen[s]
        return po[pair[cur]], s[cur]

    def candidates(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray,
                   reach: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`QueryIndex.candidates <knnmon.workers.query_index.QueryIndex.candidates>` (the
        query's indexed box for its region): one level-by-level traversal, each pair starting at
        its keyword's entry points (:meth:`PackedRTree.entries_of`); with ``reach``, the pairs that
        pass the pre-test."""
        po, px, py, pc = self._points(lon, lat, pair_obj, pair_code)
        objs, slots = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for part in (self._base, self._delta):
            pair, node = part.tree.entries_of(px, py, pc)  # from each keyword's entry points
            o, s = self._hits(part, pair, node, po)
            objs.append(o)
            slots.append(s)
        obj, slot = np.concatenate(objs), np.concatenate(slots)
        self.found = len(obj)
        return (obj, slot) if reach is None else pretested(lon, lat, obj, slot, reach)
