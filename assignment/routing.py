"""The routing table: for an arriving object, the workers that must receive it.

An object in cell ``c`` carrying keyword ``key`` must reach every worker holding a query ``q``
with ``key in q.keywords`` and ``c in R_q``: only such queries can have the object in their kNN
(``docs/concepts.md``: it must share a keyword and lie within ``r_q``; ``R_q`` holds the whole kNN circle,
see :mod:`knnmon.assignment.loadmodel`). The table stores, per keyword, the bitmask of workers
that need the keyword **everywhere** (a rectangle spanning the grid, e.g. ``r_q = inf``),
sparsely, ``(keyword, cell) -> bitmask`` for the rest, and, for the pairs the entry bound leaves
out of the cells, a few rectangles per pair (:mod:`knnmon.assignment.routing_regions`). The table
is complete by construction: per worker and keyword it holds the exact union of the queries'
rectangles, or a superset of it. Bitmasks are uint64, so ``W <= 64``. A run changes the table as
queries come, go and move: :class:`knnmon.coordinator.live_routing.LiveRouting`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.assignment.base import Plan
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.region_entries import merge_entries
from knnmon.assignment.routing_lookup import CodeStarts, compile_lookup, route_pairs
from knnmon.assignment.routing_regions import DEFAULT_TILES, KeywordRegions
from knnmon.assignment.workload import Workload
from knnmon.errors import InvalidArgumentError
from knnmon.grid import Grid
from knnmon.vocabulary_table import VocabularyTable, compile_vocabulary_kernels

__all__ = ["MAX_ENTRIES", "RoutingTable", "check_max_entries", "popcount"]

#: Default bound on the table's (keyword, cell) entries, counted per worker before merging:
#: 16 M entries are at most 256 MiB of keys and masks (the build holds ~3x that at its peak).
#: 300 k synthetic queries on 12 workers would need 747 M (4.2 GB after merging).
MAX_ENTRIES = 16_000_000


def check_max_entries(max_entries: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``max_entries`` (``plan.routing_entries``) is ``>= 0``."""
    if max_entries < 0:
        raise InvalidArgumentError(f"plan.routing_entries (the routing table's max_entries) must be >= 0; "
                                   f"got {max_entries}")


def popcount(masks: np.ndarray) -> np.ndarray:
    """Number of set bits of each uint64: ``(n,)`` int64."""
    m = np.asarray(masks, dtype=np.uint64)
    return np.unpackbits(m.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(np.int64)


class RoutingTable:
    """``(cell, keyword) -> workers`` as uint64 bitmasks (see the module docstring).

    Attributes
    ----------
    grid : Grid
    vocabulary : list of str, keyword of each code
    always : ``(K,)`` uint64, workers needing keyword ``code`` in every cell
    keys : ``(p,)`` int64 sorted, ``code * n_cells + cell``
    masks : ``(p,)`` uint64, workers for ``keys``
    regions : :class:`KeywordRegions`, the pairs held as rectangles (the build's promoted pairs)
    """

    def __init__(self, grid: Grid, vocabulary: list[str], always: np.ndarray, keys: np.ndarray,
                 masks: np.ndarray, regions: KeywordRegions | None = None) -> None:
        self.grid, self.vocabulary = grid, vocabulary
        self.always, self.keys, self.masks = always, keys, masks
        self.regions = regions if regions is not None else KeywordRegions()
        #: How :meth:`build` made the table (pairs, promotions); empty otherwise.
        self.stats: dict[str, int | float] = {}
        self._words: VocabularyTable | None = None
        self._starts = CodeStarts()
        compile_lookup()  # (from numba's cache after the first time: no batch pays for it)
        compile_vocabulary_kernels()

    @classmethod
    def build(cls, workload: Workload, model: LoadModel, plan: Plan,
              max_entries: int = MAX_ENTRIES, tiles: int = DEFAULT_TILES) -> RoutingTable:
        """The table of ``plan`` (every worker's queries, rectangles and keywords).

        A (worker, keyword) pair whose rectangles cover every cell goes to ``always`` (no loss).
        If the other pairs' cells exceed ``max_entries`` (counted per worker, before merging
        workers), the pairs that save the most cells per extra expected delivery are
        **promoted** until the rest fit: each is held as its queries' bounding rectangles per
        tile (:meth:`KeywordRegions.of_queries`, ``tiles`` per side; ``tiles=0``: sent
        everywhere instead, as before). Sent everywhere, a pair would add ``P(key) - P(Cov,
        key)`` deliveries per object (:meth:`LoadModel.covered_probability`), the ranking's
        price and the bound of what its rectangles add. Keywords absent from the statistics go
        last (the model cannot price them). Either way the table stays a superset of what the
        queries need, so results stay exact; only deliveries grow. :attr:`stats` has the counts.

        Raises
        ------
        InvalidArgumentError
            ``max_entries < 0`` or ``tiles < 0``.
        """
        check_max_entries(max_entries)
        if tiles < 0:
            raise InvalidArgumentError(f"tiles (of the routing table's rectangles) must be >= 0; got {tiles}")
        always = np.zeros(len(workload.vocabulary), dtype=np.uint64)
        pairs = _PairStats()
        key_parts, bit_parts, total, n_full = [], [], 0, 0
        for w, bit, codes, covered, window in _coverages(workload, model, plan):
            if covered is None:
                always[codes] |= bit
                continue
            cells = covered.sum(axis=(1, 2))
            full = cells == model.grid.n_cells
            always[codes[full]] |= bit
            n_full += int(full.sum())
            part = ~full
            codes, covered, cells = codes[part], covered[part], cells[part]
            window = (window[0][part], window[1][part])
            covered_p, total_p = model.covered_probability(codes, covered, window)
            extra = np.where(codes < len(model.keywords), np.maximum(total_p - covered_p, 0.0), np.inf)
            pairs.add(w, codes, cells, extra)
            total += int(cells.sum())
            if total <= max_entries:
                _append_entries(key_parts, bit_parts, model, bit, codes, covered, window)
        regions = KeywordRegions()
        if total > max_entries:  # promote pairs, then collect the others' cells again
            promoted = pairs.masks(pairs.cheapest_to_drop(total - max_entries), len(always))
            if tiles:
                regions = _promoted_regions(workload, plan, promoted & ~always, model.grid.n, tiles)
            else:
                always |= promoted
            key_parts, bit_parts = [], []
            for w, bit, codes, covered, window in _coverages(workload, model, plan):
                if covered is not None:
                    keep = ((always[codes] | promoted[codes]) & bit) == 0
                    _append_entries(key_parts, bit_parts, model, bit, codes[keep], covered[keep],
                                    (window[0][keep], window[1][keep]))
        keys, masks = merge_entries(key_parts, bit_parts)
        table = cls(model.grid, list(workload.vocabulary), always, keys, masks, regions)
        table.stats = {"routing_pairs_full": n_full, "routing_pairs": pairs.n, "routing_region_rects": len(regions),
                       "routing_pairs_promoted": pairs.promoted,
                       "routing_promoted_extra_deliveries": pairs.promoted_extra,
                       "routing_pair_cells": total, "routing_entries": len(keys),
                       "routing_max_entries": int(max_entries)}
        return table

    def route_v(self, cells: np.ndarray, owner: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Worker bitmasks of objects.

        Parameters
        ----------
        cells
            ``(n,)`` int cell of each object (:meth:`Grid.cell_of`).
        owner, codes
            ``(e,)`` int64: object index and keyword code of each (object, keyword) pair;
            ``code < 0`` (a keyword no query has) is skipped.

        Returns
        -------
        ``(n,)`` uint64 bitmask of workers per object.
        """
        out = np.zeros(len(cells), dtype=np.uint64)
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        owner, codes = np.ascontiguousarray(owner, dtype=np.int64), np.ascontiguousarray(codes, dtype=np.int64)
        starts = self._starts.of(self.keys, self.regions.code, self.grid.n_cells, len(self.always))
        route_pairs(out, cells, owner, codes, self.always, self.grid.n, self.keys, self.masks, starts, self.regions)
        return out

    def route_objects(self, lon: np.ndarray, lat: np.ndarray, keywords: pa.Array) -> np.ndarray:
        """Worker bitmasks of objects given as degrees and a list<string> keyword array."""
        owner, codes = self.encode(keywords)
        return self.route_v(self.grid.cell_of(lon, lat), owner, codes)

    def encode(self, keywords: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """``(object, keyword code)`` int64 arrays of a list<string> array; ``-1``: no query has it.
        The codes are looked up in :attr:`words` from the array's own buffers (no Python string
        per keyword)."""
        if isinstance(keywords, pa.ChunkedArray):
            keywords = keywords.combine_chunks()
        owner = pc.list_parent_indices(keywords).to_numpy().astype(np.int64)
        return owner, self.words.codes(keywords.flatten())

    @property
    def words(self) -> VocabularyTable:
        """The vocabulary as a hash table (keyword -> code), built at its first use."""
        if self._words is None:
            self._words = VocabularyTable(self.vocabulary)
        return self._words

    def prepare(self) -> None:
        """Build what the first batch's routing would otherwise build: :attr:`words` and each
        keyword's starts in the sorted entries (a second or so at millions of keywords)."""
        self.words  # noqa: B018  (built on first use)
        self._starts.of(self.keys, self.regions.code, self.grid.n_cells, len(self.always))

    @property
    def entries(self) -> int:
        """(keyword, cell) entries held."""
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Memory of the table's arrays in bytes."""
        return int(self.always.nbytes + self.keys.nbytes + self.masks.nbytes + self.regions.nbytes)


def _coverages(workload: Workload, model: LoadModel, plan: Plan):
    """``(worker, bit, codes, covered, window)`` of every worker's :meth:`LoadModel.coverage` chunks."""
    owner = workload.owner
    entry_worker = plan.worker[owner]
    for w in range(plan.workers):
        e = np.flatnonzero(entry_worker == w)
        bit = np.uint64(1) << np.uint64(w)
        for codes, covered, window in model.coverage(owner[e], workload.code[e], workload.rects):
            yield w, bit, codes, covered, window


def _promoted_regions(workload: Workload, plan: Plan, promoted: np.ndarray, n: int, tiles: int) -> KeywordRegions:
    """The rectangles of the promoted pairs (``promoted[code]``: their workers' bits) from their
    queries' regions."""
    owner, code = workload.owner, workload.code
    worker = plan.worker[owner].astype(np.int64)
    pick = (promoted[code] >> worker.astype(np.uint64)) & np.uint64(1) == 1
    q = owner[pick]
    r = workload.rects
    return KeywordRegions.of_queries(code[pick], worker[pick], r.x0[q], r.y0[q], r.x1[q], r.y1[q], n, tiles)


def _append_entries(key_parts: list, bit_parts: list, model: LoadModel, bit: np.uint64, codes: np.ndarray,
                    covered: np.ndarray, window: tuple[np.ndarray, np.ndarray]) -> None:
    """Append the ``code * n_cells + cell`` keys of a coverage chunk, each with ``bit``."""
    j, cy, cx = np.nonzero(covered)
    wx0, wy0 = np.broadcast_to(window[0], len(codes)), np.broadcast_to(window[1], len(codes))
    cell = (cy + wy0[j]) * model.grid.n + (cx + wx0[j])
    key_parts.append(codes[j].astype(np.int64) * model.grid.n_cells + cell)
    bit_parts.append(np.full(len(cell), bit, dtype=np.uint64))


class _PairStats:
    """Per (worker, keyword) pair held as cells: its cell count and the extra deliveries per
    object if it went to ``always`` instead (``inf``: unknown keyword)."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self.promoted, self.promoted_extra = 0, 0.0

    def add(self, worker: int, codes: np.ndarray, cells: np.ndarray, extra: np.ndarray) -> None:
        self.parts.append((worker, codes, cells, extra))

    @property
    def n(self) -> int:
        return sum(len(p[1]) for p in self.parts)

    def cheapest_to_drop(self, excess: int) -> tuple[np.ndarray, np.ndarray]:
        """``(worker, code)`` int64 arrays of the pairs to promote: fewest extra deliveries per
        cell saved first, until at least ``excess`` cells are saved."""
        worker = np.concatenate([np.full(len(p[1]), p[0], dtype=np.int64) for p in self.parts])
        code = np.concatenate([p[1] for p in self.parts]).astype(np.int64)
        cells = np.concatenate([p[2] for p in self.parts]).astype(np.int64)
        extra = np.concatenate([p[3] for p in self.parts])
        order = np.lexsort((-cells, extra / np.maximum(cells, 1)))
        take = int(np.searchsorted(np.cumsum(cells[order]), excess)) + 1
        pick = order[:take]
        self.promoted = len(pick)
        finite = extra[pick][np.isfinite(extra[pick])]
        self.promoted_extra = float(finite.sum())
        return worker[pick], code[pick]

    @staticmethod
    def masks(pairs: tuple[np.ndarray, np.ndarray], n_codes: int) -> np.ndarray:
        """``(n_codes,)`` uint64: the bits of ``pairs`` OR-ed per code."""
        out = np.zeros(n_codes, dtype=np.uint64)
        worker, code = pairs
        np.bitwise_or.at(out, code, np.left_shift(np.uint64(1), worker.astype(np.uint64)))
        return out
