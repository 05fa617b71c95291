"""A window's live objects in parts, each with its own index, merged and rebuilt off the search's
path (:class:`~knnmon.coordinator.runtime.object_store.ObjectStore` with a window).

The parts are in arrival order. They merge as in a size-tiered LSM tree: :data:`MERGE_RATIO`
neighbouring parts of one size become one (each object is built again once per size, about
log(live / SEAL) / log(MERGE_RATIO) times; merging the newest into the one before while it held a
quarter as many built each object ~5 times, a third of a windowed coordinator's CPU), so there
are O(MERGE_RATIO log(live / SEAL)) parts; a part is rebuilt from its live objects once fewer
than half of it are live. Both cost a new :class:`ObjectIndex` and its trees, seconds for a
large part (docs/window.md): a stall of the stream when a refill search waited for it. A
:class:`Compactor` builds them on a thread of its own (the index's kernels and Arrow release
the GIL), one at a time, while searches go on over the old parts; the new part replaces its
sources at the next search or expiry, with the expiries since applied. The live objects searched
are the same before and after, so every search stays exact.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from knnmon.coordinator.runtime.object_index import ObjectIndex

__all__ = ["Compactor", "FIT_BEFORE_SEARCHES", "MERGE_RATIO", "Part"]

#: Neighbouring parts merge this many at a time, of one size (within this factor).
MERGE_RATIO = 4
#: A part is rebuilt from its live objects once fewer than this share of it are live.
REBUILD_LIVE = 0.5
#: A part's index boxes are fitted to its live objects again once this many of them expired
#: since the last fit (``ObjectIndex.refit``), so that searches skip the space of the expired
#: objects (a region whose places all expired, whose queries all refill); times the last fit's
#: nodes over :data:`REFIT_NODES` when it visited more (objects expiring all over: most nodes are
#: visited). A count, not a time, so that a run does the same fits every time (~50,000 nodes took
#: ~10 ms here).
REFIT_MIN, REFIT_NODES = 1000, 50_000
#: A fit that left fewer than this share of the nodes it visited empty (objects expiring here and
#: there, not a region's: no node's space emptied) makes the next wait twice as many expired
#: objects, up to :data:`REFIT_IDLE` times; one that emptied more, the usual count again (on
#: places in random order the fits cost 14 % of a windowed coordinator's CPU, and sped no search).
REFIT_YIELD, REFIT_IDLE = 0.01, 16
#: A search of this many queries or more (a refill wave: the queries of a region whose objects
#: just expired) first fits every part with objects expired since its last fit, whatever their
#: count: a fit costs 10-150 ms there, the search over boxes that still span the emptied region
#: up to seconds (docs/window.md, "Refill waves").
FIT_BEFORE_SEARCHES = 1000


@dataclass
class Part:
    """Objects indexed together, with the live ones marked (``alive``: ``None`` while all are)."""

    table: pa.Table
    index: ObjectIndex
    t: np.ndarray
    alive: np.ndarray | None = None
    fitted: int | None = None  # the cutoff the index's boxes were last fitted to
    fit_nodes: int = 0  # the last fit's cost
    fit_wait: int = 1  # the next fit waits this many times the usual count (idle fits before)
    fit_expired: int = 0  # the objects expired at the last fit
    cutoff: int | None = None  # the cutoff ``alive`` holds

    @classmethod
    def of(cls, table: pa.Table, index: ObjectIndex | None = None) -> Part:
        return cls(table, index if index is not None else ObjectIndex(table), table.column("t").to_numpy())

    @property
    def live(self) -> int:
        return len(self.t) if self.alive is None else int(self.alive.sum())

    def expire(self, cutoff: int) -> Part | None:
        """This part with the objects of ``t <= cutoff`` marked expired (a new ``alive`` array:
        a build reading the old one is not disturbed), or ``None`` when none is live."""
        if not len(self.t) or self.t.max() <= cutoff:
            return None
        if self.t.min() > cutoff:
            return self
        self.alive, self.cutoff = self.t > cutoff, cutoff
        return self

    @property
    def fit_due(self) -> bool:
        """Enough objects expired since the last fit for the next (:data:`REFIT_MIN`)."""
        since = len(self.t) - self.live - self.fit_expired
        return since >= REFIT_MIN * max(1.0, self.fit_nodes / REFIT_NODES) * self.fit_wait

    def fit(self) -> None:
        """Fit the index's boxes to the live objects (``ObjectIndex.refit``) if any expired
        since the last fit. Safe beside a search, and on another thread than :meth:`expire`'s
        (it fits to the ``alive`` it read first: a later expiry's objects wait for the next)."""
        alive, cutoff, fitted = self.alive, self.cutoff, self.fitted
        if alive is None or fitted == cutoff:
            return
        since = ~alive if fitted is None else ~alive & (self.t > fitted)
        if since.any():
            nodes, emptied = self.index.refit(alive, np.flatnonzero(since))
            self.fit_wait = min(REFIT_IDLE, 2 * self.fit_wait) if emptied < REFIT_YIELD * nodes else 1
            self.fit_nodes, self.fit_expired, self.fitted = nodes, len(self.t) - int(alive.sum()), cutoff


def _tier(parts: list[Part]) -> list[Part]:
    """The newest run of :data:`MERGE_RATIO` or more neighbouring parts of one size (the largest
    under ``MERGE_RATIO`` times the smallest), or none."""
    end = len(parts)
    while end >= MERGE_RATIO:
        i, lo, hi = end - 1, parts[end - 1].live, parts[end - 1].live
        while i >= 1 and max(hi, parts[i - 1].live) < MERGE_RATIO * min(lo, parts[i - 1].live):
            i -= 1
            lo, hi = min(lo, parts[i].live), max(hi, parts[i].live)
        if end - i >= MERGE_RATIO:
            return parts[i:end]
        end = i
    return []


def _build(sources: list[tuple[pa.Table, np.ndarray | None]]) -> Part:
    """A part of the live objects of ``sources`` (table, alive), every keyword's tree built."""
    tables = [t if alive is None else t.filter(pa.array(alive)) for t, alive in sources]
    part = Part.of(pa.concat_tables(tables).combine_chunks())
    part.index.build_trees()
    return part


class Compactor:
    """Merges and rebuilds of a window's parts (module docstring), one at a time.

    Parameters
    ----------
    background
        Build on a thread of its own (default); ``False``: at once, on the caller's thread.
    """

    def __init__(self, background: bool = True) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="knnmon-parts") if background else None
        self._fits = ThreadPoolExecutor(1, thread_name_prefix="knnmon-fit") if background else None
        self._job: tuple[list[Part], Future] | None = None
        self._fitting: Future | None = None
        #: Parts built (merges and rebuilds) and swapped in.
        self.builds = 0

    def plan(self, parts: list[Part]) -> None:
        """Start the next build the parts need, unless one runs: a merge of the newest run, else
        a rebuild of the first part under half live."""
        if self._job is not None:
            return
        sources = _tier(parts) or \
            next(([p] for p in parts if p.alive is not None and p.live < REBUILD_LIVE * len(p.t)), [])
        if not sources:
            return
        args = [(p.table, p.alive) for p in sources]
        if self._pool is not None:
            future = self._pool.submit(_build, args)
        else:
            future = Future()
            future.set_result(_build(args))
        self._job = (sources, future)

    def poll(self, parts: list[Part], cutoff: int | None) -> list[Part]:
        """``parts`` with a finished build in place of its sources (the objects of ``t <=
        cutoff`` marked in it), and the next build started; ``parts`` itself otherwise."""
        if self._job is None or not self._job[1].done():
            return parts
        sources, future = self._job
        self._job = None
        new = future.result()
        new = new.expire(cutoff) if cutoff is not None else new
        gone = {id(p) for p in sources}
        at = next((j for j, p in enumerate(parts) if id(p) in gone), None)
        if at is not None:  # (all of them expired meanwhile: nothing to put back)
            parts = parts[:at] + ([new] if new is not None else []) + [p for p in parts[at:] if id(p) not in gone]
        self.builds += 1
        self.plan(parts)
        return parts

    def fit(self, parts: list[Part]) -> None:
        """Fit the parts due (:attr:`Part.fit_due`) on a thread of their own, unless a fit runs
        (a fit of half a million objects' trees takes a second: not on the stream's path)."""
        if self._fitting is not None:
            if not self._fitting.done():
                return
            self._fitting.result()  # (raises what the last fit raised)
        due = [p for p in parts if p.fit_due]
        if self._fits is None or not due:
            for p in due:
                p.fit()
            return
        self._fitting = self._fits.submit(lambda: [p.fit() for p in due])

    def wait(self) -> None:
        """Wait for the build and the fit in flight (tests; a shutdown)."""
        if self._job is not None:
            self._job[1].result()
        if self._fitting is not None:
            self._fitting.result()

    def close(self) -> None:
        """Stop the threads (a build in flight is dropped)."""
        for pool in (self._pool, self._fits):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._job = self._fitting = None
