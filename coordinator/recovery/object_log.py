"""The objects stream read back at a start: the preload plus every entry the consumer group has
delivered (acknowledged or not), parsed in columns (:mod:`knnmon.bulk_parse`), with a window
only the live ones; the pending entries and their rejects; and the check that refuses state from
the future (:func:`check_event_time`). A resumed start reads it in a child process
(:func:`read_elsewhere`) while the workers load.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import redis

from knnmon.bulk_parse import OBJECT_SCHEMA, parse_objects
from knnmon.connection import connect
from knnmon.coordinator.runtime.preparation import live_initial
from knnmon.coordinator.recovery.object_snapshot import read_chunks
from knnmon.errors import PoisonedWatermarkError, Rejected, StoreUnavailableError
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.protocol import GROUP, group_info, redis_clock_ms, entry_order
from knnmon.termination import end_with_parent
from knnmon.window import Window

if TYPE_CHECKING:
    from knnmon.coordinator.runtime.object_index import ObjectIndex

__all__ = ["OBJECT_SCHEMA", "ObjectLog", "check_event_time", "checkpoint_watermark", "create_groups",
           "read_elsewhere", "read_object_log", "read_objects", "undelivered"]

#: Objects as the service holds them.


@dataclass
class ObjectLog:
    """What the objects stream holds for a start (:func:`read_objects`): ``objects`` (the
    preload and every entry delivered, with a window only the live ones at the watermark of all
    of them), the ``pending`` entry ids (delivered, not acknowledged) with the ``rejects`` among
    them, the entries ``read``, the ``spans`` (:attr:`Recovered.spans`) and ``unacked`` (the
    pending entries parsed: ``(entry id, fields, t, object id)``); ``index``: an
    :class:`~knnmon.coordinator.runtime.object_index.ObjectIndex` over ``objects`` made on the
    reading thread (:func:`~knnmon.coordinator.recovery.rebuild.recover`), or ``None``."""

    objects: pa.Table
    pending: list[str]
    rejects: list[tuple[str, dict, Rejected]]
    read: int
    spans: list[tuple[str, str, int | None]]
    unacked: list[tuple[str, dict, int, str]]
    seconds: float = 0.0
    index: ObjectIndex | None = None

    @property
    def pending_ids(self) -> set[str]:
        """The object ids of the pending entries that parsed."""
        return {oid for *_, oid in self.unacked}


def read_objects(client: redis.Redis, keys: Keys, preload: pa.Table, limits: Limits, skip: frozenset[str],
                 window: int | None, allowed_lateness: int) -> ObjectLog:
    """:func:`read_object_log`, and with a window only the live objects: a pending entry whose
    object is already expired at the watermark of everything delivered is late, rejected as the
    service would have.

    Raises
    ------
    StoreUnavailableError, PoisonedWatermarkError
        As :func:`recover`.
    """
    t0 = time.perf_counter()
    objects, pending, rejects, read, spans, unacked = read_object_log(client, keys, preload, limits, skip)
    if window is not None and objects.num_rows:
        cutoff = Window(window, int(objects.column("t").to_numpy().max()), allowed_lateness).cutoff
        rejects += [(eid, fields, Rejected("late", f"t={t} <= {cutoff} (the watermark minus the window)"))
                    for eid, fields, t, _ in unacked if t <= cutoff]
        objects = live_initial(objects, window, allowed_lateness)
    return ObjectLog(objects, pending, rejects, read, spans, unacked, time.perf_counter() - t0)


def create_groups(client: redis.Redis, keys: Keys) -> None:
    """Create the consumer group on both ingest streams (and the streams) if missing."""
    for key in (keys.ingest_objects, keys.ingest_queries):
        try:
            client.xgroup_create(key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as ex:
            if "BUSYGROUP" not in str(ex):
                raise


def _group(client: redis.Redis, key: str) -> dict:
    g = group_info(client, key)
    if g is None:
        raise StoreUnavailableError(f"consumer group {GROUP!r} vanished from {key}")
    return g


def undelivered(client: redis.Redis, key: str) -> int:
    last = _group(client, key)["last-delivered-id"]
    return len(client.xrange(key, min="(" + last if last != "0-0" else "-", max="+"))


def read_object_log(client: redis.Redis, keys: Keys, preload: pa.Table, limits: Limits = DEFAULT_LIMITS,
                    skip: frozenset[str] = frozenset(), chunk: int = 10_000
                    ) -> tuple[pa.Table, list[str], list[tuple[str, dict, Rejected]], int, list, list]:
    """Preloaded objects plus every delivered entry of the objects stream but those in
    ``skip``; the ids of the delivered but unacknowledged entries (not in ``skip``), the
    rejects among those, the entries read, :attr:`Recovered.spans`, and the unacknowledged
    entries parsed: ``(entry id, fields, t, object id)`` (with a window the late ones are rejected).

    The ranges the checkpoints wrote in columns are taken from their chunks
    (:mod:`~knnmon.coordinator.recovery.object_snapshot`), the rest parsed, ``chunk`` entries at
    a time.

    Raises
    ------
    PoisonedWatermarkError
        An acknowledged entry fails with ``future`` now: an earlier knnmon (or one with a laxer
        ``--max-future``) applied it, since this one deletes the ``future`` entries it rejects
        (:func:`check_event_time`).
    """
    key = keys.ingest_objects
    clock = redis_clock_ms(client) if limits.max_future_ms is not None else None
    last = _group(client, key)["last-delivered-id"]
    pending = set()
    if last != "0-0":
        summary = client.xpending(key, GROUP)
        if summary["pending"]:
            rows = client.xpending_range(key, GROUP, min="-", max="+", count=summary["pending"])
            pending = {r["message_id"] for r in rows} - skip
    log = _LogReader(client, key, limits, clock, pending, skip, set(preload.column("id").to_pylist()))
    if last != "0-0":
        at = "-"
        for c in read_chunks(client, keys, OBJECT_SCHEMA, limits, last, sorted(pending | skip), clock):
            log.parse(at, "(" + c.first, chunk)
            log.take(c)
            at = "(" + c.last
        log.parse(at, last, chunk)
        if log.chunks:
            log.read = _entries_up_to(client, key, last)
    check_event_time(client, keys, limits, log.poisoned, clock)
    table = pa.concat_tables([preload, *log.tables]) if log.tables else preload
    return table, sorted(pending, key=entry_order), log.rejects, log.read, log.spans, log.unacked


class _LogReader:
    """:func:`read_object_log`'s reading: the stream's ranges parsed, the chunks taken, the ids
    seen so far (the first of an id is the object; a repeat is a ``duplicate_id``)."""

    def __init__(self, client: redis.Redis, key: str, limits: Limits, clock: int | None, pending: set[str],
                 skip: frozenset[str], seen: set[str]) -> None:
        self.client, self.key, self.limits, self.clock = client, key, limits, clock
        self.pending, self.skip, self.seen = pending, skip, seen
        self.tables: list[pa.Table] = []
        self.rejects: list[tuple[str, dict, Rejected]] = []
        self.spans: list[tuple[str, str, int | None]] = []
        self.unacked: list[tuple[str, dict, int, str]] = []
        self.poisoned: list[tuple[str, Rejected]] = []
        self.read = 0  # (entries parsed; with chunks taken, counted in Redis at the end)
        self.chunks = 0

    def take(self, c) -> None:
        """A chunk's objects (:class:`~knnmon.coordinator.recovery.object_snapshot.Chunk`), but
        ids seen before; its spans."""
        seen, new = self.seen, []
        for oid in c.objects.column("id").to_pylist():
            new.append(oid not in seen)
            seen.add(oid)
        new = np.asarray(new, dtype=bool)
        self.tables.append(c.objects if new.all() else c.objects.filter(pa.array(new)))
        self.spans += [(a, b, None if t == -(1 << 63) else t) for a, b, t in c.spans]
        self.chunks += 1

    def parse(self, start: str, end: str, chunk: int) -> None:
        """Parse the entries ``start``..``end`` (XRANGE bounds)."""
        pending, seen, skip = self.pending, self.seen, self.skip
        while True:
            entries = self.client.xrange(self.key, min=start, max=end, count=chunk)
            self.read += len(entries)
            kept = [e for e in entries if e[0] not in skip] if skip else entries
            cols = parse_objects(kept, self.limits, clock_ms=self.clock)
            take = []
            for i, ((eid, fields), ok) in enumerate(zip(kept, cols.ok.tolist())):
                if ok:
                    oid = cols.ids[i]
                    if oid not in seen:
                        seen.add(oid)
                        take.append(i)
                        if eid in pending:
                            self.unacked.append((eid, fields, int(cols.t[i]), oid))
                        continue
                    r = Rejected("duplicate_id", f"id={oid}")
                else:
                    r = cols.rejects[i]
                if eid in pending:
                    self.rejects.append((eid, fields, r))
                elif r.reason == "future" and str(fields.get("id", "")).strip() not in seen:
                    self.poisoned.append((eid, r))
            rows = np.asarray(take, dtype=np.int64)
            if take:
                self.tables.append(cols.table(rows))
            if entries:
                self.spans.append((entries[0][0], entries[-1][0], int(cols.t[rows].max()) if take else None))
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0]


def _entries_up_to(client: redis.Redis, key: str, last: str) -> int:
    """Entries of stream ``key`` up to ``last`` (inclusive), counted in Redis in one step."""
    return int(client.eval("return redis.call('XLEN', KEYS[1]) - #redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+')",
                           1, key, last))


def check_event_time(client: redis.Redis, keys: Keys, limits: Limits, poisoned: list[tuple[str, Rejected]],
                     clock: int | None) -> None:
    """Refuse to start on state from the future (:class:`PoisonedWatermarkError`): acknowledged
    object entries (``poisoned``: entry id, why) that the bound ``limits.max_future_ms`` rejects
    now, or a checkpoint's watermark ahead of Redis's clock ``clock`` by more than twice the
    bound (an entry id may lead the clock by the bound, and its ``t`` the entry id by as much)."""
    if clock is None:
        return
    bound = limits.max_future_ms
    _, watermark = checkpoint_watermark(client.hgetall(keys.serve_checkpoint))
    ahead = watermark is not None and watermark - clock > 2 * bound
    if not poisoned and not ahead:
        return
    what = []
    if poisoned:
        eid, r = poisoned[0]
        what.append(f"{len(poisoned):,} acknowledged entries of {keys.ingest_objects} are from the future by "
                    f"today's bound (--max-future {bound:,} ms), e.g. entry {eid}: {r.detail}")
    if ahead:
        what.append(f"the last checkpoint's watermark {watermark} is {watermark - clock:,} ms ahead of Redis's clock")
    raise PoisonedWatermarkError(
        "refusing to start: " + "; ".join(what) + ". An earlier knnmon (or one with --max-future off) applied them, "
        "so a window expired every object before them and rejected newer ones as late. Starting without them would "
        "change the results silently. Stop here and run `knnmon repair --watermark` (same --redis/--namespace): it "
        "rejects those entries as `future`, and the next start recomputes every result exactly, the objects "
        "rejected as late because of them included; or start with --max-future off to keep them")


def checkpoint_watermark(checkpoint: dict[str, str]) -> tuple[str | None, int | None]:
    """The ``watermark`` field of a ``knn:serve:checkpoint`` hash: as stored (``None``: none),
    and as a number (``None``: none, or not a number; nothing reads it back but the start-up
    check and the repair)."""
    raw = checkpoint.get("watermark")
    if raw in (None, ""):
        return None, None
    try:
        return raw, int(raw)
    except ValueError:
        return raw, None


def _read_in_child(url: str, namespace: str, preload: pa.Table, limits: Limits, skip: frozenset[str],
                   window: int | None, allowed_lateness: int) -> ObjectLog:
    """:func:`read_objects` in a child process (:func:`read_elsewhere`)."""
    from knnmon.heap import bulk_build

    client = connect(url)
    try:
        with bulk_build():
            return read_objects(client, Keys(namespace), preload, limits, skip, window, allowed_lateness)
    finally:
        client.close()


def read_elsewhere(url: str, namespace: str, *args) -> Future:
    """The future of :func:`read_objects` (``args``: its arguments after the keys), read in a
    child process while this one reads the queries and loads the workers: the read is
    Python-bound, and a thread here would take turns with them. Spawned, not forked (Ray's
    threads may run here); it ends with this process (:func:`~knnmon.termination.end_with_parent`:
    a service SIGKILLed during a recovery would otherwise leave it behind with what it read)."""
    executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=end_with_parent)
    try:
        return executor.submit(_read_in_child, url, namespace, *args)
    finally:
        executor.shutdown(wait=False)
