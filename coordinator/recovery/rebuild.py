"""Recovery: rebuild the service's state from what Redis holds, after a restart or an outage.

The results are a function of the set of objects seen (ties by id), so recovery recomputes them
rather than replaying: the queries come from Redis (``knn:queries`` and their hashes), the
objects from the preloaded ingest output plus every entry of ``knn:ingest:objects`` the group
has delivered, acknowledged or not (with a window, the stream holds only what the last checkpoint
kept, :mod:`~knnmon.coordinator.recovery.checkpoint`, and only the live objects at the watermark,
the largest ``t`` among them, count). Each query's exact kNN over them is compared with its
stored result, and a query whose result differs (a batch that was only partly written when the
service died) gets the difference written as one change (:class:`~knnmon.batch.BatchChanges`,
through the workers' script, in the change feed) at the version after the largest one written
(:func:`feed_version`), and the stream's batches go on after it. The delivered but unacknowledged
object entries are returned for the service to acknowledge (their rejects written);
unacknowledged query operations are applied again by the service (both are idempotent).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import redis

from knnmon.arrays import runs, segment_sums
from knnmon.batch import BatchChanges
from knnmon.coordinator.recovery.kept_start import kept_start, queries_of
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.preparation import Prepared, prepare_tables
from knnmon.coordinator.recovery.stored_start import StoredStart
from knnmon.coordinator.recovery.object_log import (OBJECT_SCHEMA, ObjectLog, create_groups, read_elsewhere,
                                                   read_objects, undelivered)
from knnmon.coordinator.recovery.resume import forget_settings, stored_start, why_not_resumable
from knnmon.errors import Rejected
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS, Limits, check_keywords, parse_k, parse_point, parse_query_id
from knnmon.results import ResultReader
from knnmon.query import Query, QueryColumns
from knnmon.workers.placements import placement_number, placement_of

__all__ = ["Recovered", "feed_version", "read_queries", "reconcile", "recover"]

log = logging.getLogger("knnmon.serve")

@dataclass
class Recovered:
    """What :func:`recover` rebuilt.

    Attributes
    ----------
    prepared
        Every recovered query with its exact kNN over every object delivered (results repaired
        already), and the stream batches applied before (``first_batch``, from the change feed).
    queries
        The registered queries, by id.
    log
        The objects stream's :class:`ObjectLog`; with :attr:`stored`, the future of it (read in
        a child process while the workers load), which the runtime waits for
        (:attr:`objects_log`).
    queries_entries_read
        Entries of the queries stream delivered to the group so far.
    repaired
        Stored results that differed and were repaired.
    seconds
        Its steps' wall time: ``objects`` (the objects stream read and parsed), ``queries``
        (their hashes), ``search`` (the exact kNN and the plan), ``reconcile`` (the stored
        results compared and repaired).
    stored
        Set when the workers start from the results Redis holds
        (:mod:`~knnmon.coordinator.recovery.resume`): then ``prepared`` holds the queries, and the
        live objects once the runtime has them, without their kNN; nothing is searched or repaired.
        A :class:`~knnmon.coordinator.recovery.kept_start.KeptStart` when the workers taken from
        the service before are kept as they are (nothing is loaded either).
    """

    prepared: Prepared
    queries: dict[str, Query]
    log: ObjectLog | Future
    queries_entries_read: int
    repaired: int
    seconds: dict[str, float] = field(default_factory=dict)
    stored: StoredStart | None = None

    @property
    def objects_log(self) -> ObjectLog:
        """:attr:`log`, waited for."""
        return self.stored.objects() if self.stored is not None else self.log

    @property
    def pending(self) -> list[str]:
        """Delivered but unacknowledged entries of ``ingest:objects`` (stream order), for the
        service to acknowledge with :attr:`rejects`, the rejects among them."""
        return self.objects_log.pending

    @property
    def rejects(self) -> list[tuple[str, dict, Rejected]]:
        return self.objects_log.rejects

    @property
    def objects_entries_read(self) -> int:
        """Entries of the objects stream delivered to the group so far."""
        return self.objects_log.read

    @property
    def spans(self) -> list[tuple[str, str, int | None]]:
        """``(first entry id, last entry id, largest t)`` of the stream's entries read, in chunks
        (the checkpoints' record of what the live objects need)."""
        return self.objects_log.spans


#: (object, keyword) pairs whose trees a start builds in one step (a search waits for one step at most).
TREE_STEP = 65_536


def _read_and_index(client: redis.Redis, keys: Keys, preload: pa.Table, limits: Limits, skip: frozenset[str],
                    window: int | None, allowed_lateness: int) -> ObjectLog:
    """:func:`read_objects`, with the :class:`ObjectIndex` of the objects read, made on the
    reading thread while the main one plans; with a window, every keyword's tree is then built
    on a thread of its own (the refills search them from the first batch on; the kernels release
    the GIL), while the service starts and serves."""
    got = read_objects(client, keys, preload, limits, skip, window, allowed_lateness)
    if got.objects.num_rows:
        got.index = ObjectIndex(got.objects)
        if window is not None:
            threading.Thread(target=got.index.build_trees, args=(TREE_STEP,), name="knnmon-trees", daemon=True).start()
    return got


def _in_thread(read, url: str, *args) -> Future:
    """The future of ``read(client, *args)`` run on a thread with a client of its own."""
    from concurrent.futures import ThreadPoolExecutor

    from knnmon.connection import connect

    def run():
        client = connect(url)
        try:
            return read(client, *args)
        finally:
            client.close()

    executor = ThreadPoolExecutor(1, thread_name_prefix="knnmon-objects")
    try:
        return executor.submit(run)
    finally:
        executor.shutdown(wait=False)


def _queries_read(client: redis.Redis, keys: Keys) -> int:
    """Entries of the queries stream delivered to the group so far."""
    return client.xlen(keys.ingest_queries) - undelivered(client, keys.ingest_queries)


def _from_stored(model, stored: StoredStart, queries: list[Query], got, queries_read: int,
                 seconds: dict[str, float]) -> Recovered:
    """What a start from the stored results (or with the workers kept) recovered: the queries
    and, once the runtime has them, the live objects, without their kNN; nothing searched or
    repaired; the stream's batches after the replay's."""
    prepared = Prepared(model, stored.queries.to_table(), OBJECT_SCHEMA.empty_table(), OBJECT_SCHEMA.empty_table(),
                        None, np.empty(0, np.int64), np.zeros(len(queries), np.int64), np.empty(0),
                        np.full(len(queries), np.inf), {}, first_batch=stored.number + 1)
    return Recovered(prepared, {q.id: q for q in queries}, got, queries_read, 0, seconds, stored)


def read_queries(client: redis.Redis, keys: Keys, chunk: int = 10_000, limits: Limits = DEFAULT_LIMITS,
                 placed: dict[str, tuple] | None = None) -> list[Query]:
    """The registered queries (``knn:queries`` and their hashes); a hash that does not make a
    valid query within ``limits`` (a client with write access to Redis may have written it) is
    logged and left out. ``placed``: filled with each query's placement as its hash holds it
    (:func:`~knnmon.workers.placements.placement_of`)."""
    qids = sorted(client.smembers(keys.queries))
    queries = []
    for qid, h, _ in ResultReader(client, keys, chunk=chunk).many(qids, hashes=True, results=False):
        try:
            q = Query.from_hash(qid, h)
            parse_query_id(qid), parse_point(q.lon, q.lat), parse_k(q.k, limits), check_keywords(q.keywords, limits)
            queries.append(q)
            if placed is not None:
                placed[qid] = placement_of(h)
        except (KeyError, ValueError):
            log.warning("query %s: unreadable or out-of-bounds hash %r in Redis; left out", str(qid)[:64],
                        {k: str(v)[:64] for k, v in list(h.items())[:8]})
    return queries


#: Change feed versions at or above this are unreadable: the write script's Lua numbers hold
#: integers exactly below 2**53 only (any client may write the feed).
MAX_VERSION = 10 ** 15


def feed_version(client: redis.Redis, keys: Keys, last: int = 1000) -> int:
    """The largest change feed version among the feed's ``last`` entries (0 if empty): the
    stream batches a service applied before it stopped, so that a restart continues the
    versions (every entry of one batch carries the same one; batches are applied one at a time).
    A version that is not a number below :data:`MAX_VERSION` is left out and counted."""
    best, unreadable = 0, 0
    for _, fields in client.xrevrange(keys.changes, count=last):
        if "version" in fields:
            n = placement_number(fields["version"])
            if n is None or n >= MAX_VERSION:
                unreadable += 1
            else:
                best = max(best, n)
    if unreadable:
        log.warning("%d change feed entries with an unreadable version; left out", unreadable)
    return best


def reconcile(url: str, namespace: str, client: redis.Redis, prepared: Prepared, chunk: int = 10_000) -> int:
    """Make every stored result equal the recomputed exact kNN (module docstring), each repair
    at the feed version ``prepared.first_batch``; returns how many results were repaired. The
    results are read and compared in columns, :data:`chunk` queries at a time; only those that
    differ are looked at one by one."""
    from knnmon.workers.result_writer import ResultWriter

    keys = Keys(namespace)
    q = prepared.queries
    if not q.num_rows:
        return 0
    qids = q.column("id").to_pylist()
    k = q.column("k").to_numpy().astype(np.int64)
    store = ObjectStore(prepared.initial, prepared.index)
    reader = ResultReader(client, keys, chunk=chunk)
    writer = ResultWriter(url, namespace, "recovery")
    fixed = 0
    try:
        for s in range(0, len(qids), chunk):
            part = np.arange(s, min(s + chunk, len(qids)), dtype=np.int64)
            lists = prepared.knn_lists(part)  # (the chunk's ids in one take)
            cut = np.minimum(lists.counts, k[part])  # with a reserve, the list beyond k is not stored
            new_at = runs(np.cumsum(lists.counts) - lists.counts, cut)
            new_ids = np.asarray([lists.ids[j] for j in new_at.tolist()], dtype=object)
            new_d = lists.dist[new_at]
            old_n, old_ids, old_d = reader.result_columns([qids[i] for i in part.tolist()])
            old_start = np.cumsum(old_n) - old_n
            new_start = np.cumsum(cut) - cut
            same = old_n == cut
            a, b = runs(new_start[same], cut[same]), runs(old_start[same], cut[same])
            unequal = (new_ids[a] != np.asarray(old_ids, dtype=object)[b]) | (new_d[a] != old_d[b])
            same[np.flatnonzero(same)[segment_sums(unequal, cut[same]) > 0]] = False
            diffs, rows = [], []
            for j in np.flatnonzero(~same).tolist():
                i = int(part[j])
                new = [(o, float(d)) for o, d in zip(new_ids[new_start[j]:new_start[j] + cut[j]].tolist(),
                                                     new_d[new_start[j]:new_start[j] + cut[j]].tolist())]
                old = list(zip(old_ids[old_start[j]:old_start[j] + old_n[j]],
                               old_d[old_start[j]:old_start[j] + old_n[j]].tolist()))
                old_set, new_set = {o for o, _ in old}, {o for o, _ in new}
                diffs.append((qids[i], [(o, d) for o, d in new if o not in old_set],
                              [o for o, _ in old if o not in new_set]))
                rows += [int(r) for r, (o, _) in zip(prepared.knn_rows(i), new) if o not in old_set]
            if diffs:
                writer.write_repairs(-1 - s, BatchChanges.from_diffs(diffs, store.initial_info(np.asarray(rows)),
                                                                   prepared.first_batch))
                fixed += len(diffs)
    finally:
        writer.close()
    return fixed


def recover(client: redis.Redis, url: str, namespace: str, preload: pa.Table, model, *, processes: int = 2,
            limits: Limits = DEFAULT_LIMITS, skip: frozenset[str] = frozenset(), window: int | None = None,
            reserve: int = 0, allowed_lateness: int = 0, settings: dict[str, str] | None = None,
            pool=None) -> Recovered:
    """Rebuild the service's state (module docstring), or with ``settings`` (what the service
    runs with, :func:`~knnmon.coordinator.recovery.resume.settings_of`) read what a start from the
    stored results needs when :mod:`~knnmon.coordinator.recovery.resume` allows it
    (:attr:`Recovered.stored`).

    Parameters
    ----------
    preload
        Objects seen before the stream (:data:`OBJECT_SCHEMA`; may be empty).
    model
        The load model new plans are made with.
    processes
        Processes for the exact kNN search (1 once Ray runs in this process: forking is unsafe then).
    limits
        The bounds the entries were parsed with (the same entries are rejected again).
    skip
        Delivered entries of the objects stream to leave out, and pending (poison isolation).
    window
        The service's window, ms: only the live objects count (``None``: all).
    allowed_lateness
        With a window: the watermark trails the largest ``t`` by this much, ms.
    reserve
        Neighbours each query keeps beyond ``k`` (:class:`~knnmon.workers.worker.KnnWorker`).
    pool
        The service's workers; those it took from the service before (``pool.kept``) are kept as
        they are when :mod:`~knnmon.coordinator.recovery.kept_start` allows (:attr:`Recovered.stored`
        a :class:`~knnmon.coordinator.recovery.kept_start.KeptStart`), else reset here.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable, or the consumer group vanished.
    PoisonedWatermarkError
        Objects from the future that an earlier version applied
        (:func:`~knnmon.coordinator.recovery.object_log.check_event_time`).
    """
    keys, t0 = Keys(namespace), time.perf_counter()
    create_groups(client, keys)
    why = why_not_resumable(client, keys, settings, skip) if settings is not None else "asked to recover in full"
    got: ObjectLog | Future
    keeping = why is None and pool is not None and bool(pool.kept)
    if keeping:  # read in a thread while the workers say what they hold (the checkpoints' chunks: ~1 s)
        got = _in_thread(_read_and_index, url, keys, preload, limits, skip, window, allowed_lateness)
        kept, why_kept = kept_start(pool, client, keys, int(settings["workers"]), got, feed_version(client, keys) + 1)
        if kept is not None:
            log.info("recovery: every worker is kept as it is (its state equals what Redis holds; %s)",
                     ", ".join(f"{k} {v:.1f} s" for k, v in kept.seconds.items()))
            seconds = {"workers": time.perf_counter() - t0, **{f"workers {k}": v for k, v in kept.seconds.items()}}
            return _from_stored(model, kept, queries_of(kept), got, _queries_read(client, keys), seconds)
        log.info("recovery: the workers taken from the service before are not kept: %s", why_kept)
    if pool is not None and pool.kept:
        pool.reset_taken()  # (before any worker loads)
    if not keeping:  # (keeping: read on the thread already; a start from the stored results: while the workers load)
        got = (read_elsewhere(url, namespace, preload, limits, skip, window, allowed_lateness) if why is None
               else read_objects(client, keys, preload, limits, skip, window, allowed_lateness))
    t1 = time.perf_counter()
    placed: dict[str, tuple] = {}
    queries = read_queries(client, keys, limits=limits, placed=placed)
    queries_read = _queries_read(client, keys)
    t2 = time.perf_counter()
    seconds = {"queries": t2 - t1}
    if why is None and client.scard(keys.queries) != len(queries):
        why = "a registered query's hash is unreadable"
    stored = None
    if why is None:
        stored, why = stored_start(queries, placed, int(settings["workers"]), got, feed_version(client, keys) + 1)
    if stored is not None:
        log.info("recovery: every worker starts from the results Redis holds")
        return _from_stored(model, stored, queries, got, queries_read, seconds)
    forget_settings(client, keys, url)  # (until the results are exact again: resume's docstring)
    if isinstance(got, Future):
        got = got.result()
    if not queries and not got.read:
        log.info("fresh start: no query registered and no object delivered yet")
    else:
        log.info("recovery: every result searched again and compared with Redis (%s)", why)
    seconds = {"objects": got.seconds, **seconds}
    prepared = prepare_tables(model, QueryColumns.of(queries).to_table(), got.objects, OBJECT_SCHEMA.empty_table(),
                              processes=processes, reserve=reserve)
    t3 = time.perf_counter()
    # The repairs take the version after the largest written (a batch cut short by the stop may
    # have written it for some queries), and the stream goes on after them.
    repair_version = feed_version(client, keys) + 1
    prepared.first_batch, prepared.placed = repair_version, placed
    repaired = reconcile(url, namespace, client, prepared)
    prepared.first_batch = repair_version + 1
    if repaired:
        log.warning("recovery: %d stored results differed from the exact kNN over the delivered objects (work in "
                    "flight when the service stopped) and were repaired, one change feed line each", repaired)
    seconds.update(search=t3 - t2, reconcile=time.perf_counter() - t3)
    return Recovered(prepared, {q.id: q for q in queries}, got, queries_read, repaired, seconds)
