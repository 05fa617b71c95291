"""The routing table's keyword regions: a (worker, keyword) pair routed by a few rectangles
instead of its cells or everywhere.

A pair's cells are the exact union of its queries' regions ``R_q``, and a query whose kNN circle
is wide (a rare keyword) covers many cells for each keyword it has. At 1 M synthetic queries the
pairs need about 1 G cells, 60 times the table's bound. The bound used to send the
pairs it could not hold **everywhere**: exact, but each such pair then received every object
with its keyword, and on 1 M queries at W = 12 this was 6.1 of the 6.8 workers an object
reached.

Instead, a pair left out of the cells is held here as the bounding rectangles of its queries'
regions, one per **tile**: the grid is cut into ``tiles x tiles`` tiles and a query belongs to
the tile of its region's centre. The union of the rectangles holds every region of the pair, so
the table stays a superset of what the queries need and results stay exact; a pair costs one
rectangle per tile its queries are in, not one entry per cell. Rectangles grouped by tile stay
tight for a plan that splits by space (a set is a few tiles), and for a plan that scatters its
queries they widen toward the whole grid, which is what such a pair needs anyway [ours; issue 37
names "per-set MBR lists" as one fix].

The lookup of a batch's (object, keyword) pairs scans the rectangles of each pair's keyword (at
most ``W * tiles**2``) in the routing table's one compiled pass
(:mod:`knnmon.assignment.routing_lookup`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_TILES", "KeywordRegions"]

#: Tiles per side (so ``16`` tiles): on 1 M synthetic queries at W = 12 an object reached 2.95
#: workers with 4, 4.37 with 1 and 2.94 with 16.
DEFAULT_TILES = 4


class KeywordRegions:
    """Rectangles of grid cells per keyword code, each with a worker bitmask.

    Attributes
    ----------
    code : ``(r,)`` int64, sorted
    x0, y0, x1, y1 : ``(r,)`` int32, inclusive cell bounds
    mask : ``(r,)`` uint64, the workers the rectangle routes ``code`` to
    """

    def __init__(self, code: np.ndarray | None = None, x0: np.ndarray | None = None, y0: np.ndarray | None = None,
                 x1: np.ndarray | None = None, y1: np.ndarray | None = None, mask: np.ndarray | None = None) -> None:
        if code is None:
            code, mask = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
            x0 = y0 = x1 = y1 = np.empty(0, dtype=np.int32)
        order = np.argsort(code, kind="stable")
        self.code = np.asarray(code, dtype=np.int64)[order]
        self.x0, self.y0, self.x1, self.y1 = (np.asarray(a, dtype=np.int32)[order] for a in (x0, y0, x1, y1))
        self.mask = np.asarray(mask, dtype=np.uint64)[order]

    @classmethod
    def of_queries(cls, code: np.ndarray, worker: np.ndarray, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray,
                   y1: np.ndarray, n: int, tiles: int = DEFAULT_TILES) -> KeywordRegions:
        """The rectangles of ``p`` (query, keyword) pairs: per (keyword, worker, tile of the
        region's centre), the bounding rectangle of the regions.

        Parameters
        ----------
        code, worker
            ``(p,)`` int: keyword code and worker of each pair.
        x0, y0, x1, y1
            ``(p,)`` int: the pair's query region ``R_q``, inclusive cells of an ``n x n`` grid.
        tiles
            Tiles per side, ``>= 1``.
        """
        code, worker = np.asarray(code, dtype=np.int64), np.asarray(worker, dtype=np.int64)
        x0, y0, x1, y1 = (np.asarray(a, dtype=np.int64) for a in (x0, y0, x1, y1))
        if not len(code):
            return cls()
        tile = (((y0 + y1) // 2) * tiles // n) * tiles + ((x0 + x1) // 2) * tiles // n
        order = np.lexsort((tile, worker, code))
        group = np.stack([code[order], worker[order], tile[order]])
        start = np.flatnonzero(np.r_[True, (np.diff(group, axis=1) != 0).any(axis=0)])
        return cls(group[0, start], np.minimum.reduceat(x0[order], start), np.minimum.reduceat(y0[order], start),
                   np.maximum.reduceat(x1[order], start), np.maximum.reduceat(y1[order], start),
                   np.left_shift(np.uint64(1), group[1, start].astype(np.uint64)))

    def __len__(self) -> int:
        return len(self.code)

    @property
    def nbytes(self) -> int:
        """Memory of the arrays in bytes."""
        return int(sum(a.nbytes for a in (self.code, self.x0, self.y0, self.x1, self.y1, self.mask)))

    def withdraw(self, codes: np.ndarray, bit: np.uint64) -> None:
        """Clear ``bit`` from the rectangles of keyword ``codes`` (``(c,)`` int64), in place."""
        if len(self.code) and len(codes):
            hit = np.isin(self.code, codes)
            self.mask[hit] &= ~np.uint64(bit)

    def recoded(self, code_map: np.ndarray) -> KeywordRegions:
        """The same rectangles with code ``c`` as ``code_map[c]`` (another table's codes);
        rectangles whose code maps to ``-1`` are dropped."""
        new = np.asarray(code_map, dtype=np.int64)[self.code] if len(self.code) else self.code
        keep = new >= 0
        return KeywordRegions(new[keep], self.x0[keep], self.y0[keep], self.x1[keep], self.y1[keep], self.mask[keep])

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by name (``region_code``, ``region_x0``, ..., ``region_mask``), to save."""
        return {"region_code": self.code, "region_x0": self.x0, "region_y0": self.y0, "region_x1": self.x1,
                "region_y1": self.y1, "region_mask": self.mask}

