"""A static, packed R-tree over 3-D boxes in numpy arrays, searched level by level for a batch.

Why not ``rtree`` (libspatialindex): a batch's search starts each (object, keyword) pair at its
keyword's entry points inside the tree (below) and goes down level by level for the whole batch
at once. That needs the internal nodes of every level, which ``rtree`` does not expose
(``Index.leaves()`` gives the leaf level only, and no tree height). Here the tree is a list
of arrays, one per level, so that one level of a batch's traversal is one vectorised test of
every (child MBR, point) pair, with no Python loop over objects or nodes.

Layout: the entries are sorted by keyword code, then in quadtree order: by the Z-order (Morton)
cell, at the level of their own size, that holds their centre, smaller boxes after the larger
ones of the same cell (a bottom-up packing; on 100 k real queries' regions this order searched
in 10 ms per batch where centre-Morton order took 12.7 and centre-Morton by size class 29), and
cut into leaves of ``fanout`` entries; ``fanout`` consecutive nodes of a level form one node of the level above,
up to a single root. The children of node ``i`` of a level are ``i * fanout ..
i * fanout + fanout - 1`` of the level below: no pointer arrays. The third dimension is the
**keyword code**: an entry's box is ``[x0, x1] x [y0, y1] x [code, code]``, a node's the union of
its children's; an (object, keyword) pair is the point ``(lon, lat, code)``. Sorting by code
first keeps a node's code range narrow, so the tree is keyword-aware: a pair enters only the
nodes of its keyword (``docs/concepts.md``, "The worker"). Since a
keyword's entries are one run, its subtree is known in advance: :meth:`PackedRTree.entries_of`
starts each pair at its keyword's entry points, the few nodes that cover the run at the deepest
level where they are at most ``fanout`` (a tree per keyword, without one), skipping the levels
above, which only tell keywords apart (on 100 k real queries' regions: 8.4 ms per batch of 1,000
objects instead of 11.8 from the root).
"""

from __future__ import annotations

import numpy as np

from knnmon.workers.query_index import zorder

__all__ = ["PackedRTree"]


def _size_class(x0, y0, x1, y1) -> np.ndarray:
    """``(n,)`` int64: ``ceil(log2)`` of a box's larger side in units of 0.022 degrees (a level-0
    grid cell), 0..14: the quadtree level whose cells are about the box's size."""
    ext = np.maximum(x1 - x0, y1 - y0)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.ceil(np.log2(np.maximum(ext, 1e-9) / (360.0 / 2 ** 14)))
    return np.clip(np.nan_to_num(c, nan=14.0, posinf=14.0), 0, 14).astype(np.int64)


class PackedRTree:
    """A packed R-tree (module docstring), built once from its entries; immutable.

    Parameters
    ----------
    x0, y0, x1, y1
        ``(n,)`` float64 degrees: each entry's box (``x0 <= x1``, ``y0 <= y1``).
    code
        ``(n,)`` int64: each entry's keyword code.
    fanout
        Entries per leaf and children per node (Wang et al. used 10 and 20; default 4, the
        fastest of 4, 8 and 16 on real queries' regions: docs/batching.md).

    Attributes
    ----------
    order : numpy.ndarray
        ``(n,)`` int64: the input position of each entry, in the tree's entry order.
    height : int
        Node levels: level 0 is the root, level ``height - 1`` the leaves, and level
        ``height`` the entries themselves (0 for an empty tree).

    Raises
    ------
    ValueError
        Arrays of different lengths, or ``fanout < 2``.
    """

    def __init__(self, x0, y0, x1, y1, code, *, fanout: int = 4) -> None:
        x0, y0, x1, y1 = (np.asarray(a, dtype=np.float64) for a in (x0, y0, x1, y1))
        code = np.asarray(code, dtype=np.int64)
        n = len(code)
        if not all(len(a) == n for a in (x0, y0, x1, y1)):
            raise ValueError("entry arrays must have the same length")
        if fanout < 2:
            raise ValueError(f"fanout must be >= 2; got {fanout}")
        self.fanout = int(fanout)
        if n:
            size = _size_class(x0, y0, x1, y1)
            cell = zorder((x0 + x1) / 2, (y0 + y1) / 2)
            quad = (cell >> (2 * size)) << (2 * size)  # the quadtree cell a box of its size belongs to
            self.order = np.lexsort((size, quad, code))
        else:
            self.order = np.empty(0, np.int64)
        o = self.order
        # Each level: boxes (m, 4) float64 [x0, y0, x1, y1] and codes (m, 2) int64 [c0, c1].
        box = np.column_stack([x0[o], y0[o], x1[o], y1[o]]) if n else np.empty((0, 4))
        codes = np.column_stack([code[o], code[o]]) if n else np.empty((0, 2), np.int64)
        levels = [(box, codes)]
        while len(levels[-1][0]) > 1 or len(levels) == 1:
            b, c = levels[-1]
            if not len(b):
                break
            starts = np.arange(0, len(b), self.fanout)
            nb = np.column_stack([np.minimum.reduceat(b[:, 0], starts), np.minimum.reduceat(b[:, 1], starts),
                                  np.maximum.reduceat(b[:, 2], starts), np.maximum.reduceat(b[:, 3], starts)])
            nc = np.column_stack([np.minimum.reduceat(c[:, 0], starts), np.maximum.reduceat(c[:, 1], starts)])
            levels.append((nb, nc))
        levels.reverse()  # root first, the entries last
        self._box = [b for b, _ in levels]
        self._code = [c for _, c in levels]
        self.height = len(levels) - 1
        self.sizes = [len(b) for b in self._box]
        self._entry_points()

    def __len__(self) -> int:
        return len(self.order)

    @property
    def entry_boxes(self) -> np.ndarray:
        """``(n, 4)`` float64 ``[x0, y0, x1, y1]`` of the entries, in tree order."""
        return self._box[-1]

    @property
    def entry_codes(self) -> np.ndarray:
        """``(n,)`` int64 keyword code of the entries, in tree order."""
        return self._code[-1][:, 0]

    def _entry_points(self) -> None:
        """Per keyword code, where a search for it may start: the deepest level at which at most
        ``fanout`` nodes cover the code's entries (entries are sorted by code, so they are one
        run, and a node of level ``h`` covers ``fanout ** (height - h)`` consecutive entries),
        and the first of those nodes. The levels above only tell codes apart."""
        codes = self._code[-1][:, 0] if self.height else np.empty(0, np.int64)
        n_codes = int(codes.max()) + 1 if len(codes) else 0
        self._start = np.full(n_codes, -1, dtype=np.int64)  # -1: no entry has the code
        self._first = np.zeros(n_codes, dtype=np.int64)
        self._count = np.zeros(n_codes, dtype=np.int64)
        if not len(codes):
            return
        u, lo = np.unique(codes, return_index=True)
        hi = np.r_[lo[1:], len(codes)] - 1
        start = np.zeros(len(u), dtype=np.int64)
        for h in range(self.height):  # deepest level wins: later levels overwrite
            span = self.fanout ** (self.height - h)
            few = hi // span - lo // span + 1 <= self.fanout
            start[few] = h
        span = self.fanout ** (self.height - start)
        self._start[u] = start
        self._first[u] = lo // span
        self._count[u] = hi // span - lo // span + 1

    def descend(self, pair: np.ndarray, node: np.ndarray, px: np.ndarray, py: np.ndarray, pc: np.ndarray,
                frm: int, to: int) -> tuple[np.ndarray, np.ndarray]:
        """Move a frontier from level ``frm`` down to level ``to`` (``height``: the entries).

        One vectorised step per level: every child of every frontier node is tested against the
        frontier pair's point, and the children that contain it form the next frontier (one test
        per (child MBR, pair), as Wang et al.'s IntersectBuffer does once per (entry, event)).

        Parameters
        ----------
        pair, node
            ``(f,)`` int64: the frontier, pairs (positions in ``px``...) at nodes of level ``frm``.
        px, py
            ``(p,)`` float64 degrees of every pair's object; ``pc`` ``(p,)`` int64 its keyword code.
        frm, to
            Levels, ``0 <= frm <= to <= height``.

        Returns
        -------
        pair, node
            ``(g,)`` int64: the frontier at level ``to`` (at ``height``: entry positions in tree order).
        """
        F = self.fanout
        step = np.arange(F, dtype=np.int64)
        for h in range(frm, to):
            if not len(pair):
                break
            child = (node[:, None] * F + step).ravel()
            pp = np.repeat(pair, F)
            valid = child < self.sizes[h + 1]
            child, pp = child[valid], pp[valid]
            hit = self._test(h + 1, pp, child, px, py, pc)
            pair, node = pp[hit], child[hit]
        return pair, node

    def _test(self, h: int, pair: np.ndarray, node: np.ndarray, px, py, pc) -> np.ndarray:
        """Mask: the nodes of level ``h`` that hold their pair's point and code."""
        b = np.take(self._box[h], node, axis=0)
        c = np.take(self._code[h], node, axis=0)
        x, y, k = px[pair], py[pair], pc[pair]
        return (b[:, 0] <= x) & (x <= b[:, 2]) & (b[:, 1] <= y) & (y <= b[:, 3]) & (c[:, 0] <= k) & (k <= c[:, 1])

    def entries_of(self, px: np.ndarray, py: np.ndarray, pc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (pair, entry) whose entry box holds the pair's point and has its code, ``(h,)``
        int64 each, entries in tree order: the search starts each pair at its code's entry
        points (:meth:`_entry_points`) instead of the root, joining the level-by-level descent
        there. The same pairs as :meth:`descend` from the root to the entries."""
        pc = np.asarray(pc, dtype=np.int64)
        if not len(self) or not len(pc):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        known = np.flatnonzero((pc >= 0) & (pc < len(self._start)))
        start = np.full(len(pc), -1, dtype=np.int64)
        start[known] = self._start[pc[known]]
        pair, node = np.empty(0, np.int64), np.empty(0, np.int64)
        for h in range(self.height + 1):
            if h:
                pair, node = self.descend(pair, node, px, py, pc, h - 1, h)
            join = np.flatnonzero(start == h)
            if len(join):
                n = self._count[pc[join]]
                jp = np.repeat(join, n)
                jn = np.repeat(self._first[pc[join]], n) + (np.arange(len(jp)) - np.repeat(np.cumsum(n) - n, n))
                ok = self._test(h, jp, jn, px, py, pc)
                pair, node = np.concatenate([pair, jp[ok]]), np.concatenate([node, jn[ok]])
        return pair, node

    def search(self, px: np.ndarray, py: np.ndarray, pc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (pair, entry) whose entry box holds the pair's point and has its code:
        ``(h,)`` int64 each, entries as input positions."""
        pair, node = self.entries_of(px, py, pc)
        return pair, self.order[node]
