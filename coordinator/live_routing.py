"""The routing table as a run changes it: the plan's :class:`~knnmon.assignment.routing.RoutingTable`
(built by the assignment, left as built) with what the run adds and withdraws.

- **Additions** (registrations, a window's refills, hand-overs, revivals): each query's keywords
  in its region's cells go to a small sorted delta, folded into the table's entries once it is
  an eighth of them, so an addition costs O(delta), not O(table). Regions added with
  ``merge=False`` route at once and are merged later (:meth:`LiveRouting.merge_pending`).
- **Withdrawals** (a re-balancing move's source, :meth:`LiveRouting.narrow`).
- **The journal** of both while a rebuild runs in the background (typed records,
  :class:`AddedRegions`, :class:`Narrowed`), which the rebuild replays on its fresh entries
  (:mod:`~knnmon.coordinator.runtime.routing_upkeep`).
- **Forwarding** during a move in flight (:meth:`LiveRouting.forward`).

The table stays a superset of what every worker's queries need, so results stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from knnmon.assignment.region_entries import compile_region_entries, merge_sorted, region_entries, withdraw
from knnmon.assignment.routing import RoutingTable
from knnmon.assignment.routing_lookup import or_entries
from knnmon.assignment.routing_regions import KeywordRegions

__all__ = ["MAX_ENTRIES_PER_QUERY", "AddedRegions", "LiveRouting", "Narrowed"]

#: The most (keyword, cell) entries one query added at run time (registration, refill, hand-over)
#: may take; a query whose keywords times cells would exceed it is routed by its keywords
#: everywhere instead (exact: a superset of its cells). One query registered with ``limits.max_keywords``
#: keywords and a region over the whole grid would otherwise add 32 x 16,384 entries to the
#: table every query shares.
MAX_ENTRIES_PER_QUERY = 4096


@dataclass(frozen=True)
class AddedRegions:
    """One :meth:`LiveRouting.add_many` call, journaled (copies): ``(m,)`` int64 ``counts`` of
    keyword ``codes`` per query, its cell rectangle ``x0 .. y1`` and ``workers``."""

    counts: np.ndarray
    codes: np.ndarray
    x0: np.ndarray
    y0: np.ndarray
    x1: np.ndarray
    y1: np.ndarray
    workers: np.ndarray

    def apply(self, routing: LiveRouting) -> int:
        """Make the call on ``routing``; returns the queries whose regions were added."""
        routing.add_many((self.counts, self.codes), self.x0, self.y0, self.x1, self.y1, self.workers)
        return len(self.counts)


@dataclass(frozen=True)
class Narrowed:
    """One :meth:`LiveRouting.narrow` call, journaled (copies of its arrays)."""

    worker: int
    codes: np.ndarray
    held: np.ndarray
    keep: np.ndarray

    def apply(self, routing: LiveRouting) -> int:
        """Make the call on ``routing``; returns 0 (no query's regions added)."""
        routing.narrow(self.worker, self.codes, self.held, self.keep)
        return 0


class LiveRouting:
    """A plan's routing table ``table`` as the run changes it (module docstring). Routes like
    :meth:`RoutingTable.route_v`, with the additions and the forwards.

    Attributes
    ----------
    table : RoutingTable
        The entries as built or last rebuilt; the delta folds into its ``keys`` and ``masks``.
    delta_keys, delta_masks : ``(d,)`` int64 sorted, uint64
        Entries added since, not yet folded in.
    additions : int
        Queries' regions added since the table was built (:meth:`add_many`).
    forwards : list of ``(source, target)``
        Every object routed to ``source`` goes to ``target`` too (:meth:`forward`).
    """

    def __init__(self, table: RoutingTable) -> None:
        self.table = table
        self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # added with merge=False, not yet in the delta
        self.additions = 0
        self._journal: list[AddedRegions | Narrowed] | None = None  # (calls while a rebuild is in flight)
        self.forwards: list[tuple[int, int]] = []
        compile_region_entries()  # (from numba's cache after the first time: no batch pays for it)

    def prepare(self) -> None:
        """:meth:`RoutingTable.prepare`."""
        self.table.prepare()

    def encode(self, keywords: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`RoutingTable.encode`."""
        return self.table.encode(keywords)

    def route_v(self, cells: np.ndarray, owner: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """:meth:`RoutingTable.route_v` with the entries added since and the forwards:
        ``(n,)`` uint64 bitmask of workers per object."""
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        owner, codes = np.ascontiguousarray(owner, dtype=np.int64), np.ascontiguousarray(codes, dtype=np.int64)
        out = self.table.route_v(cells, owner, codes)
        for keys, masks in ((self.delta_keys, self.delta_masks), *self._pending):
            or_entries(out, cells, owner, codes, self.table.grid.n_cells, keys, masks)
        for source, target in self.forwards:
            out |= ((out >> np.uint64(source)) & np.uint64(1)) << np.uint64(target)
        return out

    def route_objects(self, lon: np.ndarray, lat: np.ndarray, keywords: pa.Array) -> np.ndarray:
        """Worker bitmasks of objects given as degrees and a list<string> keyword array."""
        owner, codes = self.encode(keywords)
        return self.route_v(self.table.grid.cell_of(lon, lat), owner, codes)

    def code(self, keyword: str) -> int:
        """The code of ``keyword``, added to the vocabulary if new (a query registered at run time)."""
        t = self.table
        known = len(t.words)
        c = t.words.add(keyword)
        if c >= known:
            t.vocabulary.append(keyword)
            t.always = np.append(t.always, np.uint64(0))
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
        entries for all. A query whose entries would exceed :data:`MAX_ENTRIES_PER_QUERY` goes to
        its keywords' ``always`` masks instead. ``codes`` may also be :meth:`codes_of`'s
        ``(counts, codes)`` arrays. ``merge=False``: the regions route at once but are merged by
        :meth:`merge_pending` (a refill's regions: painted before the batch is routed, merged
        while the workers work)."""
        n = self.table.grid.n
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
        np.bitwise_or.at(self.table.always, code[wide], bit[pair_q[wide]])
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
        t = self.table
        if len(self.delta_keys) > max(1 << 16, len(t.keys) // 8):
            t.keys, t.masks = merge_sorted(t.keys, t.masks, self.delta_keys, self.delta_masks)
            self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)

    def narrow(self, worker: int, codes: np.ndarray, held: np.ndarray, keep: np.ndarray) -> int:
        """Withdraw ``worker`` from keywords ``codes`` except where it still needs them: queries
        left it (a move's source), and ``keep`` are the entries of its remaining queries with
        these keywords (their regions at their current radii, :func:`region_entries`). Its bit
        goes from every other entry of those codes, and from a code's ``always`` mask when no
        query of it still has the code (``held`` false), and so from its rectangles; a code it
        holds in ``always`` (a wide region) keeps its entries. The table stays a superset of what
        the worker's queries need, so results stay exact. Journaled like :meth:`add_many`.

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
        t = self.table
        bit = np.uint64(1) << np.uint64(worker)
        t.always[codes[~held]] &= ~bit
        t.regions.withdraw(codes[~held], bit)
        codes = codes[(t.always[codes] & bit) == 0]
        return sum(withdraw(keys, masks, codes, bit, keep, self.table.grid.n_cells)
                   for keys, masks in ((t.keys, t.masks), (self.delta_keys, self.delta_masks), *self._pending))

    def replace_entries(self, always: np.ndarray, keys: np.ndarray, masks: np.ndarray,
                        regions: KeywordRegions | None = None) -> None:
        """Hold these entries instead (a rebuild; codes of this table's vocabulary, keys sorted).
        Regions not yet merged are dropped: the journal the rebuild replays holds them."""
        t = self.table
        t.always, t.keys, t.masks = always, keys, masks
        t.regions = regions if regions is not None else KeywordRegions()
        self.delta_keys, self.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        self._pending = []

    def journal(self, on: bool) -> list[AddedRegions | Narrowed]:
        """Start (``on``) or stop journaling :meth:`add_many`'s and :meth:`narrow`'s calls;
        returns the journal so far and, when stopping, drops it. A rebuild in the background
        replays the calls made after its snapshot (:meth:`replay`)."""
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

    @property
    def entries(self) -> int:
        """(keyword, cell) entries held (the delta's and those not yet merged counted apart)."""
        return self.table.entries + len(self.delta_keys) + sum(len(k) for k, _ in self._pending)

    @property
    def nbytes(self) -> int:
        """Memory of the table's arrays in bytes."""
        return self.table.nbytes + int(self.delta_keys.nbytes + self.delta_masks.nbytes)
