"""The routing table: for an arriving object, the workers that must receive it.

An object in cell ``c`` carrying keyword ``key`` must reach every worker holding a query ``q``
with ``key in q.keywords`` and ``c in R_q``: only such queries can have the object in their kNN
(``SPEC.md``: it must share a keyword and lie within ``r_q``; ``R_q`` holds the whole kNN circle,
see :mod:`knnmon.assignment.loadmodel`). The table stores, per keyword, the bitmask of workers
that need the keyword **everywhere** (a rectangle spanning the grid, e.g. ``r_q = inf``),
sparsely, ``(keyword, cell) -> bitmask`` for the rest, and, for the pairs the entry bound leaves
out of the cells, a few rectangles per pair (:mod:`knnmon.assignment.routing_regions`). The table
is complete by construction: per worker and keyword it holds the exact union of the queries'
rectangles, or a superset of it. Bitmasks are uint64, so ``W <= 64``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.assignment.base import Plan
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.region_entries import (compile_region_entries, merge_entries, merge_sorted, region_entries,
                                             withdraw)
from knnmon.assignment.routing_lookup import CodeStarts, compile_lookup, or_entries, route_pairs
from knnmon.assignment.routing_regions import DEFAULT_TILES, KeywordRegions
from knnmon.assignment.workload import Workload
from knnmon.errors import InvalidArgumentError
from knnmon.grid import Grid
from knnmon.vocabulary_table import VocabularyTable, compile_vocabulary_kernels

__all__ = ["MAX_ENTRIES", "MAX_ENTRIES_PER_QUERY", "AddedRegions", "Narrowed", "RoutingTable", "check_max_entries",
           "popcount"]

#: Default bound on the table's (keyword, cell) entries, counted per worker before merging:
#: 16 M entries are at most 256 MiB of keys and masks (the build holds ~3x that at its peak).
#: 300 k synthetic queries on 12 workers would need 747 M (4.2 GB after merging).
MAX_ENTRIES = 16_000_000


#: The most (keyword, cell) entries one query added at run time (registration, refill, hand-over)
#: may take; a query whose keywords times cells would exceed it is routed by its keywords
#: everywhere instead (exact: a superset of its cells). One query registered with ``--max-keywords``
#: keywords and a region over the whole grid would otherwise add 32 x 16,384 entries to the
#: table every query shares.
MAX_ENTRIES_PER_QUERY = 4096


def check_max_entries(max_entries: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``max_entries`` (``--routing-entries``) is ``>= 0``."""
    if max_entries < 0:
        raise InvalidArgumentError(f"--routing-entries (the routing table's max_entries) must be >= 0; "
                                   f"got {max_entries}")


def popcount(masks: np.ndarray) -> np.ndarray:
    """Number of set bits of each uint64: ``(n,)`` int64."""
    m = np.asarray(masks, dtype=np.uint64)
    return np.unpackbits(m.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(np.int64)


@dataclass(frozen=True)
class AddedRegions:
    """One :meth:`RoutingTable.add_many` call, journaled (copies): ``(m,)`` int64 ``counts`` of
    keyword ``codes`` per query, its cell rectangle ``x0 .. y1`` and ``workers``."""

    counts: np.ndarray
    codes: np.ndarray
    x0: np.ndarray
    y0: np.ndarray
    x1: np.ndarray
    y1: np.ndarray
    workers: np.ndarray

    def apply(self, table: RoutingTable) -> int:
        """Make the call on ``table``; returns the queries whose regions were added."""
        table.add_many((self.counts, self.codes), self.x0, self.y0, self.x1, self.y1, self.workers)
        return len(self.counts)


@dataclass(frozen=True)
class Narrowed:
    """One :meth:`RoutingTable.narrow` call, journaled (copies of its arrays)."""

    worker: int
    codes: np.ndarray
    held: np.ndarray
    keep: np.ndarray

    def apply(self, table: RoutingTable) -> int:
        """Make the call on ``table``; returns 0 (no query's regions added)."""
        table.narrow(self.worker, self.codes, self.held, self.keep)
        return 0


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
        # Entries added at run time (registrations, a window's refills) go to a small sorted
        # delta, folded into keys/masks once it is an eighth of them: an addition costs
        # O(delta), not O(table).
        self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        # Regions added with merge=False: painted, routed, not yet merged into the delta.
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.additions = 0  # queries' regions added since the table was built (add_many)
        self._journal: list[AddedRegions | Narrowed] | None = None  # (calls while a rebuild is in flight)
        #: ``(source, target)``: every object routed to ``source`` goes to ``target`` too
        #: (:meth:`forward`: a move in flight).
        self.forwards: list[tuple[int, int]] = []
        #: How :meth:`build` made the table (pairs, promotions); empty otherwise.
        self.stats: dict[str, int | float] = {}
        self._words: VocabularyTable | None = None
        self._starts = CodeStarts()
        compile_region_entries()  # (from numba's cache after the first time: no batch pays for it)
        compile_lookup()
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
        for keys, masks in ((self.delta_keys, self.delta_masks), *self._pending):
            or_entries(out, cells, owner, codes, self.grid.n_cells, keys, masks)
        for source, target in self.forwards:
            out |= ((out >> np.uint64(source)) & np.uint64(1)) << np.uint64(target)
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

    def code(self, keyword: str) -> int:
        """The code of ``keyword``, added to the vocabulary if new (a query registered at run time)."""
        known = len(self.words)
        c = self.words.add(keyword)
        if c >= known:
            self.vocabulary.append(keyword)
            self.always = np.append(self.always, np.uint64(0))
        return c

    def codes_of(self, keywords: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """The keyword codes of ``m`` queries (a list<string> array), in the form
        :meth:`add_many` takes: ``(counts, codes)``, ``(m,)`` and ``(sum(counts),)`` int64;
        keywords new to the vocabulary are added (:meth:`code`)."""
        if isinstance(keywords, pa.ChunkedArray):
            keywords = keywords.combine_chunks()
        owner, code = self.encode(keywords)
        new = np.flatnonzero(code < 0)
        if len(new):
            words = keywords.flatten()
            code[new] = [self.code(words[int(j)].as_py()) for j in new]
        return np.bincount(owner, minlength=len(keywords)).astype(np.int64), code

    def add_many(self, codes: list[list[int]] | tuple[np.ndarray, np.ndarray], x0, y0, x1, y1, workers, *,
                 merge: bool = True) -> None:
        """Route query ``i``'s keyword codes ``codes[i]`` in cells ``[x0[i], x1[i]] x [y0[i], y1[i]]``
        (inclusive) to worker ``workers[i]`` too, for many queries at once: one merge of the sorted
        table for all (registering one by one would re-copy the table per query). A query whose
        entries would exceed :data:`MAX_ENTRIES_PER_QUERY` goes to its keywords' ``always``
        masks instead. ``codes`` may also be :meth:`codes_of`'s ``(counts, codes)`` arrays.
        ``merge=False``: the regions route at once but are merged into the table by
        :meth:`merge_pending` (a refill's regions: painted before the batch is routed, merged
        while the workers work)."""
        n = self.grid.n
        if isinstance(codes, tuple):
            counts, code = (np.asarray(c, dtype=np.int64) for c in codes)
        else:
            counts = np.fromiter((len(cs) for cs in codes), dtype=np.int64, count=len(codes))
            code = np.fromiter((c for cs in codes for c in cs), dtype=np.int64, count=int(counts.sum()))
        self.additions += len(counts)
        x0, y0, x1, y1, workers = (np.asarray(v, dtype=np.int64).reshape(-1) for v in (x0, y0, x1, y1, workers))
        if self._journal is not None:
            self._journal.append(AddedRegions(counts.copy(), code.copy(), x0.copy(), y0.copy(), x1.copy(), y1.copy(),
                                              workers.copy()))
        if not len(counts):
            return
        bit = np.left_shift(np.uint64(1), workers.astype(np.uint64))
        span = (x1 - x0 + 1) * (y1 - y0 + 1)
        everywhere = ((x0 == 0) & (y0 == 0) & (x1 == n - 1) & (y1 == n - 1)) | (span * counts > MAX_ENTRIES_PER_QUERY)
        pair_q = np.repeat(np.arange(len(counts)), counts)  # one (query, keyword) pair per code
        wide = everywhere[pair_q]
        np.bitwise_or.at(self.always, code[wide], bit[pair_q[wide]])
        pair_q, code = pair_q[~wide], code[~wide]
        if not len(pair_q):
            return
        new_keys, new_masks = region_entries(code, x0[pair_q], y0[pair_q], x1[pair_q], y1[pair_q], bit[pair_q], n)
        self._pending.append((new_keys, new_masks))
        if merge:
            self.merge_pending()

    def merge_pending(self) -> None:
        """Merge the regions added with ``merge=False`` into the sorted delta (folded into the
        table once it is an eighth of it)."""
        pending, self._pending = self._pending, []
        for new_keys, new_masks in pending:
            self.delta_keys, self.delta_masks = merge_sorted(self.delta_keys, self.delta_masks, new_keys, new_masks)
        if len(self.delta_keys) > max(1 << 16, len(self.keys) // 8):
            self.keys, self.masks = merge_sorted(self.keys, self.masks, self.delta_keys, self.delta_masks)
            self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)

    def narrow(self, worker: int, codes: np.ndarray, held: np.ndarray, keep: np.ndarray) -> int:
        """Withdraw ``worker`` from keywords ``codes`` except where it still needs them: queries
        left it (a move's source), and ``keep`` are the entries of its remaining queries with
        these keywords (their regions at their current radii, :func:`region_entries`). Its bit
        goes from every other entry of those codes, and from a code's ``always`` mask when no
        query of it still has the code (``held`` false), and so from its rectangles
        (:attr:`regions`); a code it holds in ``always`` (a wide region) keeps its entries. The
        table stays a superset of what the worker's queries need, so results stay exact.
        Journaled like :meth:`add_many`.

        Parameters
        ----------
        worker
            The worker, ``0 <= worker < 64``.
        codes
            ``(c,)`` int64 keyword codes, unique.
        held
            ``(c,)`` bool: whether a query still on ``worker`` has ``codes[i]``.
        keep
            ``(e,)`` int64 sorted unique ``code * n_cells + cell`` keys.

        Returns
        -------
        How many entries lost the worker's bit.
        """
        codes, held = np.asarray(codes, dtype=np.int64), np.asarray(held, dtype=bool)
        if self._journal is not None:
            self._journal.append(Narrowed(int(worker), codes.copy(), held.copy(), np.asarray(keep).copy()))
        bit = np.uint64(1) << np.uint64(worker)
        self.always[codes[~held]] &= ~bit
        self.regions.withdraw(codes[~held], bit)
        codes = codes[(self.always[codes] & bit) == 0]
        n_cells = self.grid.n_cells
        return sum(withdraw(keys, masks, codes, bit, keep, n_cells)
                   for keys, masks in ((self.keys, self.masks), (self.delta_keys, self.delta_masks), *self._pending))

    def journal(self, on: bool) -> list[AddedRegions | Narrowed]:
        """Start (``on``) or stop journaling :meth:`add_many`'s and :meth:`narrow`'s calls;
        returns the journal so far and, when stopping, drops it. A rebuild in the background
        replays the calls made after its snapshot (:meth:`replay`,
        :mod:`~knnmon.coordinator.runtime.routing_upkeep`)."""
        journal = self._journal if self._journal is not None else []
        self._journal = [] if on else None
        return journal

    def replay(self, journal: list[AddedRegions | Narrowed]) -> int:
        """Make the calls of a :meth:`journal` again, in order; returns how many queries' regions
        were added."""
        return sum(change.apply(self) for change in journal)

    def forward(self, source: int, target: int) -> None:
        """Route to ``target`` every object routed to ``source`` until :meth:`stop_forwarding`:
        queries moved from ``source`` to ``target`` before their regions are known here (a move
        in flight, :mod:`~knnmon.coordinator.rebalance.handover_flight`) are still covered by
        ``source``'s entries, so ``target`` receives a superset of what they need."""
        self.forwards.append((int(source), int(target)))

    def stop_forwarding(self, pairs: list[tuple[int, int]]) -> None:
        """Drop the :meth:`forward` of each ``(source, target)`` of ``pairs`` (once each)."""
        for pair in pairs:
            self.forwards.remove((int(pair[0]), int(pair[1])))

    def replace_entries(self, always: np.ndarray, keys: np.ndarray, masks: np.ndarray,
                        regions: KeywordRegions | None = None) -> None:
        """Hold these entries instead (a rebuild; codes of this table's vocabulary, keys sorted).
        Regions not yet merged are dropped: the journal the rebuild replays holds them."""
        self.always, self.keys, self.masks = always, keys, masks
        self.regions = regions if regions is not None else KeywordRegions()
        self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        self._pending = []

    @property
    def entries(self) -> int:
        """(keyword, cell) entries held (the delta's and those not yet merged counted apart)."""
        return len(self.keys) + len(self.delta_keys) + sum(len(k) for k, _ in self._pending)

    @property
    def nbytes(self) -> int:
        """Memory of the table's arrays in bytes."""
        return int(self.always.nbytes + self.keys.nbytes + self.masks.nbytes + self.delta_keys.nbytes
                   + self.delta_masks.nbytes + self.regions.nbytes)


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
