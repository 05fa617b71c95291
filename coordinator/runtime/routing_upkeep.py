"""Routing upkeep: rebuild the routing table from the queries' current regions now and then,
off the coordinator's thread.

At run time the routing table only grows: a registration adds its query's region, and with a
window every refill adds the refilled query's larger one (to a small delta,
:class:`~knnmon.assignment.routing.RoutingTable`). Nothing shrinks it when radii shrink, and an
unregistered query's entries stay. So once the table holds 1.5 times the entries of its last
build (plus :data:`SLACK`), or :data:`UNREGISTERED_SHARE` of the queries were unregistered since,
or it had additions and a period passed since its last build (radii shrink: a table built
while results were short routes too widely), it is built again from every worker's queries and
radii as they are now (the plan's :meth:`RoutingTable.build` over a
:class:`~knnmon.assignment.workload.Workload` of them), keeping its keyword codes (the workers'
batches are encoded with them). Its size then follows the registered queries' regions, not
history. The period starts at :data:`REBUILD_S` and doubles, up to :data:`MAX_REBUILD_S`, after
each build that only the period made due and that left the table at least
:data:`STALE_KEPT` of its size (nothing to shrink: at 100 k queries a window's far-reaching
regions kept 9 million entries through 8 such builds of 6-9 s each, each slowing the batches
beside it); a build that shrinks it, or that growth or unregisters made due, resets it
(:func:`next_period`).

The build takes seconds of CPU at 100 k queries (6-9 s in the chaos soak, docs/performance.md). Run on
a thread of the service, it took the GIL and a core from the stream: batches beside it had a p99
update time of 955 ms against 272 ms elsewhere. So the build runs in a child process of its own
at the lowest CPU priority (``nice`` 19, :func:`_child_start`): it uses the time the stream leaves
idle, and a thread here only waits for it (:meth:`RoutingUpkeep.poll` returns at once): the
workers' regions are asked for in batch order (the call is
queued behind the batches already sent, so the snapshot holds every radius those batches rely
on), the table journals every region added after that point (:meth:`LiveRouting.journal`), and
the next poll after the build swaps the fresh entries in and replays the journal. The table
routes a superset of what the queries need at every moment: the old table until the swap, the
snapshot's regions plus every region added since after it. A query unregistered during the build
keeps its entries until the next one (more deliveries, never a lost one).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.assignment.base import Plan
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.routing import RoutingTable
from knnmon.assignment.workload import Workload
from knnmon.coordinator.live_routing import LiveRouting
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import WorkerLostError
from knnmon.termination import end_with_parent

__all__ = ["MAX_REBUILD_S", "REBUILD_S", "RoutingUpkeep", "SLACK", "STALE_KEPT", "UNREGISTERED_SHARE", "next_period"]

log = logging.getLogger("knnmon.runtime")

#: Entries the table may grow by beyond 1.5x its last build before it is rebuilt.
SLACK = 1 << 16
#: Share of the queries unregistered since the last build that makes a rebuild due.
UNREGISTERED_SHARE = 0.1
#: Seconds after which a table that had additions since its last build is rebuilt (at first).
REBUILD_S = 120.0
#: The longest period :func:`next_period` backs off to (seconds).
MAX_REBUILD_S = 960.0
#: A periodic build that leaves the table at least this share of its entries shrank nothing.
STALE_KEPT = 0.9
#: Seconds :meth:`RoutingUpkeep.close` waits for a build in flight.
CLOSE_WAIT_S = 60.0


#: The CPU priority of the process that builds the table (``nice``: 19, the lowest).
BUILD_NICE = 19

_MODEL: LoadModel | None = None  # (in the child: the plan's load model, sent once)


def _child_start(model: LoadModel) -> None:
    """The build process's start: the lowest CPU priority, the model kept for every build, and
    its end once the service is gone (:func:`~knnmon.termination.end_with_parent`: ~500 MB at
    100 k queries otherwise left behind by a SIGKILLed service)."""
    global _MODEL
    os.nice(BUILD_NICE)
    _MODEL = model
    end_with_parent()


def _entries(queries: pa.Table, radius: np.ndarray, workers: np.ndarray, size: int, max_entries: int,
             words: pa.Array, word_codes: np.ndarray, n_cells: int) -> tuple:
    """In the build process: a fresh table over the workers' queries (``queries``' columns,
    ``(m,)`` float64 ``radius`` meters, ``(m,)`` int32 ``workers``) as the run's sorted entries
    ``(code, always, keys, masks, regions)``, keywords coded with the run's codes (``words[i]``
    has ``word_codes[i]``: every keyword of the queries).

    Raises
    ------
    RuntimeError
        A routed keyword has no code in the run's table (registration gives every one).
    """
    plan = Plan("upkeep", size, workers, np.zeros(len(workers), dtype=np.int32), [], np.empty(0, dtype=np.int32))
    fresh = RoutingTable.build(Workload.build(_MODEL, queries, radius), _MODEL, plan, max_entries)
    at = pc.fill_null(pc.index_in(pa.array(fresh.vocabulary, type=pa.string()), value_set=words), -1).to_numpy()
    code = np.append(word_codes, -1)[at]  # (a word of no query's: -1, never routed)
    key_code = code[fresh.keys // n_cells]
    if (key_code < 0).any() or (code[fresh.always != 0] < 0).any() or (code[fresh.regions.code] < 0).any():
        raise RuntimeError("a routed keyword has no code in the run's table")
    keys = key_code * n_cells + fresh.keys % n_cells
    order = np.argsort(keys, kind="stable")
    return code, fresh.always, _saved(keys[order]), _saved(fresh.masks[order]), fresh.regions.recoded(code)


def _saved(a: np.ndarray) -> str:
    """``a`` in a temporary ``.npy`` file (its path): millions of entries come back to the
    service as a file it reads in one call, not pickled through a pipe (9 M entries took 12 s
    there, the service's thread handing the GIL to the pipe's reader all along; 0.8 s so)."""
    fd, path = tempfile.mkstemp(prefix="knnmon-routing-", suffix=".npy")
    with os.fdopen(fd, "wb") as f:
        np.save(f, a)
    return path


def _loaded(path: str) -> np.ndarray:
    """The array :func:`_saved` wrote to ``path``; the file is removed."""
    try:
        return np.load(path)
    finally:
        os.unlink(path)


def next_period(period: float, timed: bool, before: int, after: int) -> float:
    """The period (seconds) after a build: doubled (at most :data:`MAX_REBUILD_S`) when the
    build was due to the period alone (``timed``) and its table kept at least
    :data:`STALE_KEPT` of the ``before`` entries (``after``: the fresh table's, before the
    regions added meanwhile were replayed); else :data:`REBUILD_S`."""
    if timed and after >= STALE_KEPT * before:
        return min(2 * period, MAX_REBUILD_S)
    return REBUILD_S


class RoutingUpkeep:
    """When and how the routing table is rebuilt (module docstring).

    Parameters
    ----------
    routing
        The run's table (its entries replaced at each swap).
    model
        The plan's load model (grid and keyword statistics; read only, shared with the build thread).
    pool
        The workers (asked for their queries' regions).
    max_entries
        The table's bound (``plan.routing_entries``).
    """

    def __init__(self, routing: LiveRouting, model: LoadModel, pool: WorkerPool, max_entries: int) -> None:
        self.routing, self.model, self.pool, self.max_entries = routing, model, pool, max_entries
        self.baseline = routing.entries
        self._unregistered_at = 0
        self.rebuilds = 0
        self.build_s = 0.0  # seconds of building, in the background thread, summed
        self.swap_s = 0.0  # seconds of swapping in and replaying, on the caller's thread, summed
        self._built_at = time.monotonic()
        self._additions_at = routing.additions
        self._executor: ThreadPoolExecutor | None = None
        self._process: ProcessPoolExecutor | None = None  # the build's (started with the first build)
        self._build: Future | None = None
        self._started_unregistered = 0
        self._requested = False
        self.period = REBUILD_S  # seconds between periodic builds (next_period)
        self._timed, self._before = False, 0

    def request(self) -> None:
        """Make a rebuild due now (queries moved between workers: the sources' entries go)."""
        self._requested = True

    def due(self, queries: int, unregistered: int) -> bool:
        """Whether the table grew or went stale enough to rebuild (``queries``: registered now;
        ``unregistered``: unregistered in all so far)."""
        return self._forced(queries, unregistered) or self._period_over()

    def _period_over(self) -> bool:
        """The table had additions and :attr:`period` passed since its last build."""
        return self.routing.additions > self._additions_at and time.monotonic() - self._built_at >= self.period

    def _forced(self, queries: int, unregistered: int) -> bool:
        """Due for a reason other than the period: requested, grown, or many unregistered."""
        return (self._requested or self.routing.entries > 1.5 * self.baseline + SLACK
                or unregistered - self._unregistered_at >= max(1.0, UNREGISTERED_SHARE * queries))

    @property
    def building(self) -> bool:
        """A build is in flight (started, not yet swapped in)."""
        return self._build is not None

    def poll(self, queries: int, unregistered: int) -> None:
        """Swap in a finished build, or start one when :meth:`due` (returns at once either way)."""
        if self._build is not None:
            if self._build.done():
                self._finish()
        elif (forced := self._forced(queries, unregistered)) or self._period_over():
            self._start(unregistered, timed=not forced)

    def rebuild(self, unregistered: int = 0) -> float:
        """Rebuild now and wait for it (``unregistered`` as in :meth:`due`); returns seconds spent.
        A build already in flight is finished first."""
        t0 = time.perf_counter()
        if self._build is not None:
            self._build.result()
            self._finish()
        self._start(unregistered)
        self._build.result()
        self._finish()
        return time.perf_counter() - t0

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Drop a build in flight: the build process is killed (at the lowest priority on a busy
        machine it may take minutes, and the interpreter's exit waits for a process pool's work),
        and the thread is waited for up to ``timeout_s`` seconds: it may be waiting on the
        workers (their regions), and a Ray call from another thread once Ray is shut down ends
        the process (``knnmon run --rebalance`` exited with status 1 and no summary when a
        re-plan's rebuild was in flight at the end)."""
        self.routing.journal(False)
        build, self._build = self._build, None
        if self._process is not None:
            for p in list(self._process._processes.values()):  # (no public way before Python 3.14)
                p.kill()
        if build is not None:
            try:
                build.result(timeout=timeout_s)
            except Exception as ex:  # noqa: BLE001 (dropped: only its end is waited for)
                log.info("routing table rebuild dropped at close: %s", type(ex).__name__)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._process is not None:
            self._process.shutdown(wait=False, cancel_futures=True)
            self._process = None

    def _start(self, unregistered: int, timed: bool = False) -> None:
        """Start a build (``timed``: due to the period alone, for :func:`next_period`)."""
        pending = [self.pool.regions(w) for w in range(self.pool.size)]  # in batch order
        self._timed, self._before = timed, self.routing.entries
        self._requested = False
        self.routing.journal(True)
        self.routing.table.words  # made here, read by the build thread
        self._started_unregistered = unregistered
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="knnmon-routing-rebuild")
        if self._process is None:  # (spawned: Ray's threads may run here)
            self._process = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_child_start, initargs=(self.model,))
        self._build = self._executor.submit(self._fresh_entries, pending, self._process)

    def _fresh_entries(self, pending: list[Pending[tuple[pa.Table, np.ndarray]]], process: ProcessPoolExecutor):
        """In the waiting thread: the workers' regions -> a fresh table's entries in the run's
        keyword codes, sorted, built by ``process`` (:func:`_entries`). Every keyword of a
        registered query has its code already (the registration gave it one before the
        snapshot), so the codes are only read here (:meth:`VocabularyTable.codes`, safe beside
        the caller's thread adding new keywords)."""
        t0 = time.perf_counter()
        parts = self.pool.gather(pending)
        workers = np.concatenate([np.full(c.num_rows, w, dtype=np.int32) for w, (c, _) in enumerate(parts)])
        if not len(workers):
            return None, time.perf_counter() - t0, 0
        queries = pa.concat_tables([c for c, _ in parts])
        radius = np.concatenate([rad for _, rad in parts])
        words = pc.unique(pc.list_flatten(queries.column("keywords").combine_chunks()))
        code, always, keys, masks, regions = process.submit(
            _entries, queries, radius, workers, self.pool.size, self.max_entries, words,
            self.routing.table.words.codes(words), self.routing.table.grid.n_cells).result()
        return (code, always, _loaded(keys), _loaded(masks), regions), time.perf_counter() - t0, len(workers)

    def _finish(self) -> None:
        """Swap the finished build's entries in and replay the regions added since its snapshot.
        A worker lost before it sent its regions drops the build: the table stays as it was (a
        superset still), the loss surfaces where the batches are collected, and the next poll
        starts again."""
        build, self._build = self._build, None
        journal = self.routing.journal(False)
        try:
            fresh, seconds, n_queries = build.result()
        except WorkerLostError as ex:
            log.warning("routing table rebuild dropped: %s", ex)
            return
        except BrokenProcessPool as ex:  # (the build process died: killed, out of memory)
            log.warning("routing table rebuild dropped, its process died: %s", ex)
            self._process = None
            return
        t0 = time.perf_counter()
        r = self.routing
        if fresh is None:
            self.period = REBUILD_S
            r.replace_entries(np.zeros(len(r.table.vocabulary), dtype=np.uint64), np.empty(0, np.int64),
                              np.empty(0, np.uint64))
        else:
            code, fresh_always, keys, masks, regions = fresh
            always = np.zeros(len(r.table.vocabulary), dtype=np.uint64)
            known = code >= 0
            always[code[known]] = fresh_always[known]
            r.replace_entries(always, keys, masks, regions)
            self.period = next_period(self.period, self._timed, self._before, r.entries)
        replayed = r.replay(journal)
        self.baseline, self._unregistered_at = r.entries, self._started_unregistered
        self._built_at, self._additions_at = time.monotonic(), r.additions - replayed
        self.rebuilds += 1
        swap = time.perf_counter() - t0
        self.build_s += seconds
        self.swap_s += swap
        log.info("routing table rebuilt from %d queries' regions in %.2f s (background), swapped in %.3f s with %d "
                 "regions added meanwhile replayed: %d entries; next periodic build in %.0f s", n_queries, seconds,
                 swap, replayed, r.entries, self.period)
