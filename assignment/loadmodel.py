"""The load model (Tsuruoka et al. 2019, §4.2, formulas (7)-(10); ``docs/concepts.md``).

- ``P(c, key) = cnt[c][key] / N`` (formula (7)): the probability that the next object falls in
  grid cell ``c`` and carries ``key``, from the ingest statistics (``stats.parquet``; ``N`` =
  objects counted there).
- ``R_q``: the grid cells of the **bounding box of the kNN circle** of ``q`` (radius ``r_q``
  around the query; :func:`knnmon.geo.cap_bbox`, exact on the sphere, full longitude range over
  a pole, across the 180th meridian or for ``r_q = inf``). This is a superset of the cells that
  meet the circle; a bounding box keeps every region an integer cell rectangle, so region sums
  are four look-ups in a summed-area table. Cells are clamped like objects (:class:`Grid`), so an object
  routed by its cell is always inside the rectangle of every query it can affect.
- **Query load** (8): ``L(q) = sum_{key in q} P(R_q, key)``, the expected keyword matches per
  arriving object that reach ``q``. A keyword absent from the statistics has ``P = 0``.
- **Set and worker load** (9), (10): sums of query loads.
- **Deliveries** ``D(S)`` [ours]: the expected (object, keyword) matches per arriving object
  that make the router send the object to set ``S``:
  ``D(S) = sum_key sum_{c in Cov_S(key)} P(c, key)``, with ``Cov_S(key)`` the union of the
  ``R_q`` of the members of ``S`` that carry ``key``. It counts an object once per covered keyword,
  which is the number of routing-table hits it causes (an upper bound on the objects delivered).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from knnmon.arrays import runs
from knnmon.encoding import keyword_codes
from knnmon.errors import InputPathError
from knnmon.geo import cap_bbox
from knnmon.grid import Grid

__all__ = ["LoadModel", "QueryRects"]

#: Keywords per chunk in coverage computations (bounds memory: chunk x (n+1)^2 int32).
COVERAGE_CHUNK = 256

#: :meth:`LoadModel.deliveries` prices a keyword cell by cell when its statistics rows times its
#: rectangles are at most this (cheaper than a coverage window of up to the whole grid).
SPARSE_PAIRS = 4096


@dataclass(frozen=True)
class QueryRects:
    """Integer cell rectangles ``R_q`` of queries, inclusive: ``(m,)`` int32 each."""

    x0: np.ndarray
    y0: np.ndarray
    x1: np.ndarray
    y1: np.ndarray

    def take(self, idx: np.ndarray) -> QueryRects:
        """The rectangles of queries ``idx``."""
        return QueryRects(self.x0[idx], self.y0[idx], self.x1[idx], self.y1[idx])


class LoadModel:
    """``P(c, key)`` over a grid, with region sums and coverage (see the module docstring).

    Parameters
    ----------
    grid
        The statistics grid.
    keywords
        ``(K,)`` vocabulary, sorted; code ``i`` is ``keywords[i]``.
    ptr, cells, counts
        CSR by keyword code: the cells of keyword ``i`` are ``cells[ptr[i]:ptr[i+1]]`` (int32,
        sorted) with object counts ``counts[...]`` (int64).
    n_objects
        ``N`` of formula (7); must be ``>= 1``.
    """

    def __init__(self, grid: Grid, keywords: list[str], ptr: np.ndarray, cells: np.ndarray, counts: np.ndarray,
                 n_objects: int) -> None:
        if n_objects < 1:
            raise InputPathError("the statistics count no objects: nothing to build a load model from")
        self.grid = grid
        self.keywords = keywords
        self.code = {w: i for i, w in enumerate(keywords)}
        self.ptr, self.cells, self.counts = ptr, cells, counts
        self.n_objects = int(n_objects)
        self._vocab = pa.array(keywords, type=pa.string())

    @classmethod
    def uniform(cls, n: int = 256) -> LoadModel:
        """A model with no statistics over a world grid (``n x n`` cells of 360/n x 180/n
        degrees): every ``P(c, key)`` is 0. For a service started without historical objects,
        where the grid only serves routing; loads then count queries (the runtime's fallback)."""
        from knnmon.grid import Grid

        return cls(Grid(-180.0, -90.0, 180.0, 90.0, n), [], np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32),
                   np.empty(0, dtype=np.int64), 1)

    @classmethod
    def from_ingest(cls, objects_dir: str) -> LoadModel:
        """Load ``stats.parquet`` and the grid of ``manifest.json`` from an ingest output.

        Raises
        ------
        InputPathError
            If the directory lacks ``stats.parquet`` or ``manifest.json``.
        """
        stats_path = os.path.join(objects_dir, "stats.parquet")
        manifest_path = os.path.join(objects_dir, "manifest.json")
        if not (os.path.exists(stats_path) and os.path.exists(manifest_path)):
            raise InputPathError(f"{objects_dir} is not an ingest output (no stats.parquet / manifest.json)")
        with open(manifest_path, encoding="utf-8") as fh:
            manifest = json.load(fh)
        if not manifest.get("bbox"):
            raise InputPathError(f"{objects_dir}: the ingest kept no objects")
        t = pq.read_table(stats_path, columns=["cell", "keyword", "count"])
        t = t.take(pc.sort_indices(t, sort_keys=[("keyword", "ascending"), ("cell", "ascending")]))
        enc = pc.dictionary_encode(t.column("keyword").combine_chunks())
        keywords = enc.dictionary.to_pylist()
        code = enc.indices.to_numpy()
        # The dictionary of a sorted column is in sorted order, so codes ascend with the rows.
        ptr = np.searchsorted(code, np.arange(len(keywords) + 1)).astype(np.int64)
        return cls(Grid.from_dict(manifest["grid"]), keywords, ptr, t.column("cell").to_numpy().astype(np.int32),
                   t.column("count").to_numpy().astype(np.int64), manifest["records"]["kept"])

    @property
    def grid_region(self) -> tuple[float, float, float, float]:
        """The grid's box ``(min_lon, min_lat, max_lon, max_lat)`` in degrees."""
        g = self.grid
        return (g.min_lon, g.min_lat, g.max_lon, g.max_lat)

    # -- codes -------------------------------------------------------------------------------
    def encode(self, keywords: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """``(owner, code)`` int64 arrays for a list<string> array; unknown keywords get ``-1``."""
        return keyword_codes(keywords, self._vocab)

    # -- regions -----------------------------------------------------------------------------
    def rects(self, lon: np.ndarray, lat: np.ndarray, radius_m: np.ndarray) -> QueryRects:
        """``R_q`` of each query: the cells of the bounding box of its kNN circle.

        Parameters
        ----------
        lon, lat
            ``(m,)`` float64 degrees.
        radius_m
            ``(m,)`` float64 meters, ``inf`` allowed.
        """
        lon0, lat0, lon1, lat1 = cap_bbox(lon, lat, radius_m)
        x0, y0 = self.grid.cell_xy(lon0, lat0)
        x1, y1 = self.grid.cell_xy(lon1, lat1)
        return QueryRects(x0, y0, x1, y1)

    # -- sums --------------------------------------------------------------------------------
    def _dense(self, code: int) -> np.ndarray:
        n = self.grid.n
        g = np.zeros(n * n, dtype=np.float64)
        s = slice(self.ptr[code], self.ptr[code + 1])
        g[self.cells[s]] = self.counts[s] / self.n_objects
        return g.reshape(n, n)

    def entry_loads(self, owner: np.ndarray, code: np.ndarray, rects: QueryRects,
                    sparse_pairs: int = SPARSE_PAIRS) -> np.ndarray:
        """``P(R_q, key)`` of each (query, keyword) entry: ``(e,)`` float64.

        ``owner`` indexes ``rects``; a code outside the vocabulary (``< 0`` or
        ``>= len(keywords)``: a keyword absent from the statistics) gives 0. A keyword whose
        statistics rows times entries are at most ``sparse_pairs`` is summed by testing each
        row's cell against each entry's rectangle; the others through a summed-area table of
        the whole grid (whose cost is the grid's area per keyword). Both are exact.
        """
        out = np.zeros(len(code), dtype=np.float64)
        known = np.flatnonzero((code >= 0) & (code < len(self.keywords)))
        if not len(known):
            return out
        codes, n_entries = np.unique(code[known], return_counts=True)
        n_rows = self.ptr[codes + 1] - self.ptr[codes]
        sparse = np.isin(code[known], codes[n_rows * n_entries <= sparse_pairs])
        self._sparse_entry_loads(known[sparse], owner, code, rects, out)
        known = known[~sparse]
        if not len(known):
            return out
        order = known[np.argsort(code[known], kind="stable")]
        bounds = np.flatnonzero(np.diff(code[order])) + 1
        n = self.grid.n
        for grp in np.split(order, bounds):
            sat = np.zeros((n + 1, n + 1))
            sat[1:, 1:] = self._dense(int(code[grp[0]])).cumsum(0).cumsum(1)
            q = owner[grp]
            x0, y0, x1, y1 = rects.x0[q], rects.y0[q], rects.x1[q] + 1, rects.y1[q] + 1
            out[grp] = sat[y1, x1] - sat[y0, x1] - sat[y1, x0] + sat[y0, x0]
        return out

    def _sparse_entry_loads(self, entries: np.ndarray, owner: np.ndarray, code: np.ndarray, rects: QueryRects,
                            out: np.ndarray, chunk: int = 1 << 22) -> None:
        """:meth:`entry_loads` of ``entries`` (positions, known codes) into ``out``: every
        statistics row of an entry's keyword tested against its rectangle, in chunks of pairs."""
        n = self.grid.n
        m = self.ptr[code[entries] + 1] - self.ptr[code[entries]]  # rows per entry
        ends = np.cumsum(m)
        lo = 0
        while lo < len(entries):
            base = ends[lo] - m[lo]
            hi = max(int(np.searchsorted(ends, base + chunk, side="right")), lo + 1)
            e = np.repeat(entries[lo:hi], m[lo:hi])
            row = runs(self.ptr[code[entries[lo:hi]]], m[lo:hi])
            q = owner[e]
            cx, cy = self.cells[row] % n, self.cells[row] // n
            inside = (rects.x0[q] <= cx) & (cx <= rects.x1[q]) & (rects.y0[q] <= cy) & (cy <= rects.y1[q])
            np.add.at(out, e[inside], self.counts[row[inside]] / self.n_objects)
            lo = hi

    def keyword_total(self, code: int) -> float:
        """``P(all cells, key)``: the share of objects carrying keyword ``code`` (0 if unknown)."""
        if not 0 <= code < len(self.keywords):
            return 0.0
        return float(self.counts[self.ptr[code]:self.ptr[code + 1]].sum()) / self.n_objects

    def coverage(self, owner: np.ndarray, code: np.ndarray, rects: QueryRects):
        """Cells covered per keyword by the union of the entries' rectangles.

        Parameters
        ----------
        owner, code
            ``(e,)`` int64 (query index into ``rects``, keyword code; ``-1`` entries are skipped).

        Yields
        ------
        (codes, covered, (wx0, wy0))
            First ``(full_codes, None, None)``: keywords with a rectangle spanning the whole grid
            (every cell covered). Then, per chunk of at most :data:`COVERAGE_CHUNK` keywords,
            ``codes (c,)`` and ``covered (c, h, w)`` bool, keyword ``i``'s cells over its own
            window ``[wx0[i], wx0[i] + w) x [wy0[i], wy0[i] + h)`` (``wx0``, ``wy0``: ``(c,)``
            int64; the window starts at the keyword's bounding box of rectangles, and the
            chunk's keywords have boxes of the same height and about the same width, so the
            work is about their boxes' area, not the grid's), computed exactly with 2-D
            difference arrays.
        """
        keep = code >= 0
        owner, code = owner[keep], code[keep]
        n = self.grid.n
        x0, y0, x1, y1 = rects.x0[owner], rects.y0[owner], rects.x1[owner], rects.y1[owner]
        whole = (x0 == 0) & (y0 == 0) & (x1 == n - 1) & (y1 == n - 1)
        full_codes = np.unique(code[whole])
        yield full_codes, None, None
        part = ~np.isin(code, full_codes)
        code, x0, y0, x1, y1 = code[part], x0[part], y0[part], x1[part], y1[part]
        keys, local = np.unique(code, return_inverse=True)
        if not len(keys):
            return
        # Each keyword's bounding box of rectangles; keywords ordered by its (height, width).
        kx0, ky0 = np.full(len(keys), n, dtype=np.int64), np.full(len(keys), n, dtype=np.int64)
        kx1, ky1 = np.full(len(keys), -1, dtype=np.int64), np.full(len(keys), -1, dtype=np.int64)
        np.minimum.at(kx0, local, x0)
        np.minimum.at(ky0, local, y0)
        np.maximum.at(kx1, local, x1)
        np.maximum.at(ky1, local, y1)
        kh, kw = ky1 - ky0 + 1, kx1 - kx0 + 1
        order = np.lexsort((kw, kh))
        rank = np.empty(len(keys), dtype=np.int64)
        rank[order] = np.arange(len(keys))
        by = np.argsort(rank[local], kind="stable")  # entries grouped by their keyword's rank
        erank = rank[local][by]
        x0, y0, x1, y1 = x0[by], y0[by], x1[by], y1[by]
        # Chunks: one height, at most COVERAGE_CHUNK keywords.
        h_sorted = kh[order]
        cuts = np.flatnonzero(np.diff(h_sorted)) + 1
        bounds = [0]
        for seg_end in [*cuts.tolist(), len(keys)]:
            bounds += list(range(bounds[-1] + COVERAGE_CHUNK, seg_end, COVERAGE_CHUNK)) + [seg_end]
        starts = np.searchsorted(erank, bounds)
        for b in range(len(bounds) - 1):
            k0, k1 = bounds[b], bounds[b + 1]
            if k0 == k1:
                continue
            ks = order[k0:k1]  # the chunk's keywords (indices into keys)
            e0, e1 = int(starts[b]), int(starts[b + 1])
            lk = erank[e0:e1] - k0
            nk = k1 - k0
            h, w = int(kh[ks].max()), int(kw[ks].max())
            wx0, wy0 = kx0[ks], ky0[ks]
            sx0, sy0 = x0[e0:e1] - wx0[lk], y0[e0:e1] - wy0[lk]
            sx1, sy1 = x1[e0:e1] - wx0[lk] + 1, y1[e0:e1] - wy0[lk] + 1
            base = lk * ((h + 1) * (w + 1))
            flat = np.concatenate([base + sy0 * (w + 1) + sx0, base + sy0 * (w + 1) + sx1,
                                   base + sy1 * (w + 1) + sx0, base + sy1 * (w + 1) + sx1])
            sign = np.repeat(np.array([1.0, -1.0, -1.0, 1.0]), len(lk))
            diff = np.bincount(flat, weights=sign, minlength=nk * (h + 1) * (w + 1))
            covered = diff.reshape(nk, h + 1, w + 1).cumsum(1).cumsum(2)[:, :h, :w] > 0.5
            yield keys[ks], covered, (wx0, wy0)

    def stats_rows(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the statistics of ``codes`` (in the vocabulary): ``(row, j)`` int64 arrays,
        ``j`` the position in ``codes`` of each row's keyword."""
        codes = np.asarray(codes, dtype=np.int64)
        lens = self.ptr[codes + 1] - self.ptr[codes]
        j = np.repeat(np.arange(len(codes)), lens)
        row = runs(self.ptr[codes], lens)
        return row, j

    def covered_probability(self, codes: np.ndarray, covered: np.ndarray,
                            window: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``P(Cov(key), key)`` and ``P(key)`` of one :meth:`coverage` chunk.

        Parameters
        ----------
        codes, covered, window
            A chunk as :meth:`coverage` yields it: ``(c,)`` codes, ``(c, h, w)`` bool cells.

        Returns
        -------
        ``(covered_p, total_p)``: ``(c,)`` float64 each, the share of objects that carry the
        keyword and fall in a covered cell, and the share that carry it anywhere (formula (7));
        both 0 for a keyword absent from the statistics.
        """
        n = self.grid.n
        covered_p, total_p = np.zeros(len(codes)), np.zeros(len(codes))
        known = np.flatnonzero(codes < len(self.keywords))  # others have probability 0
        row, j = self.stats_rows(codes[known])
        p = self.counts[row] / self.n_objects
        np.add.at(total_p, known[j], p)
        wx0, wy0 = np.broadcast_to(window[0], len(codes)), np.broadcast_to(window[1], len(codes))
        cx = self.cells[row] % n - wx0[known[j]]
        cy = self.cells[row] // n - wy0[known[j]]
        _, h, w = covered.shape
        inside = np.flatnonzero((cx >= 0) & (cx < w) & (cy >= 0) & (cy < h))
        hit = inside[covered[known[j[inside]], cy[inside], cx[inside]]]
        np.add.at(covered_p, known[j[hit]], p[hit])
        return covered_p, total_p

    def deliveries(self, owner: np.ndarray, code: np.ndarray, rects: QueryRects,
                   sparse_pairs: int = SPARSE_PAIRS) -> float:
        """``D(S)`` of the set whose (query, keyword) entries are given (module docstring).

        A keyword whose statistics rows times rectangles in the set are at most
        ``sparse_pairs`` is priced by testing each of its cells against each rectangle; the
        others through :meth:`coverage`'s cell arrays, whose cost is the area of their window.
        Both are exact; rare keywords with large regions (Zipf text) take the first way.
        """
        keep = (code >= 0) & (code < len(self.keywords))  # others have probability 0
        owner, code = owner[keep], code[keep]
        codes, n_rects = np.unique(code, return_counts=True)
        n_rows = self.ptr[codes + 1] - self.ptr[codes]
        sparse = np.isin(code, codes[n_rows * n_rects <= sparse_pairs])
        total = self._sparse_deliveries(owner[sparse], code[sparse], rects)
        owner, code = owner[~sparse], code[~sparse]
        for codes, covered, window in self.coverage(owner, code, rects):
            if covered is None:
                total += sum(self.keyword_total(int(c)) for c in codes)
            else:
                total += float(self.covered_probability(codes, covered, window)[0].sum())
        return total

    def _sparse_deliveries(self, owner: np.ndarray, code: np.ndarray, rects: QueryRects,
                           chunk: int = 1 << 22) -> float:
        """``D`` of entries (known codes) by testing every statistics cell of each keyword
        against every rectangle of that keyword: ``(cell, rectangle)`` pairs in chunks."""
        if not len(code):
            return 0.0
        order = np.argsort(code, kind="stable")
        owner, code = owner[order], code[order]
        codes, first, n_rects = np.unique(code, return_index=True, return_counts=True)
        row, j = self.stats_rows(codes)
        m = n_rects[j]  # rectangles to test per statistics row
        ends = np.cumsum(m)
        covered = np.zeros(len(row), dtype=bool)
        n = self.grid.n
        lo = 0
        while lo < len(row):
            base = ends[lo] - m[lo]  # pairs before row lo
            hi = max(int(np.searchsorted(ends, base + chunk, side="right")), lo + 1)
            mm = m[lo:hi]
            r = np.repeat(np.arange(lo, hi), mm)
            offset = np.arange(len(r)) - np.repeat(ends[lo:hi] - mm - base, mm)  # rectangle within the row's
            q = owner[np.repeat(first[j[lo:hi]], mm) + offset]
            cx, cy = self.cells[row[r]] % n, self.cells[row[r]] // n
            inside = (rects.x0[q] <= cx) & (cx <= rects.x1[q]) & (rects.y0[q] <= cy) & (cy <= rects.y1[q])
            covered[r[inside]] = True
            lo = hi
        return float(self.counts[row[covered]].sum()) / self.n_objects
