"""Repairing event time that an earlier knnmon let a client poison (``knnmon repair --watermark``).

Before ``--max-future`` existed, one object entry with a ``t`` far in the future (or an entry id
far in the future, which an entry without ``t`` takes as its time) moved the watermark to the
end of time: with a window every object expired, every later one was rejected as ``late``, and
a restart read the same entries back. Recovery now refuses to start on such state
(:func:`~knnmon.coordinator.recovery.object_log.check_event_time`). This repair, run while no
service runs in the namespace:

1. rejects every entry of ``knn:ingest:objects`` that fails ``future`` at Redis's clock now: its
   fields go to ``knn:ingest:rejects`` with reason ``future`` (the detail says the repair did it),
   and it leaves the objects stream (acknowledged first, if it was pending);
2. if the stream's last id lies ahead of Redis's clock by more than the bound (an entry added
   with an explicit id from the future: every entry added after it took a later id), rebuilds
   the stream from the entries left, under their own ids (Redis keeps a stream's last id even
   when its entries are deleted, and ``XSETID`` cannot go below a deleted one), with the
   consumer group delivered up to the newest entry left -- or, if the stopped service left
   entries pending, up to just before the first of them, which it then reads again -- so that
   new entries get ids from Redis's clock again (not on a Redis Cluster: ``RENAME`` stays in one
   slot);
3. counts the objects rejected as ``late`` after the first poisoned entry whose entries are
   still in the objects stream (an earlier knnmon left them there; only a checkpoint trims it,
   and under the poisoned watermark it kept everything after the poison), and recovery
   recomputes the results from every entry there, so those live at the repaired watermark count
   again at the next start (their ``late`` records stay in ``knn:ingest:rejects`` as the history
   of what happened). This version deletes every entry it rejects (kept, fields cut to 1 KiB,
   in ``knn:ingest:rejects``): a service run with ``--max-future off`` that a poisoned
   watermark made reject objects as late leaves them to be published again from their source;
4. removes the checkpoint's poisoned ``watermark`` (the hash gets ``repaired_ms``).

The next ``knnmon serve`` then recovers as after any restart: every result is recomputed over the
live objects and the differences are written as change feed lines. Objects that a checkpoint
trimmed from the stream under the poisoned watermark are gone from Redis; the repair reports the
trim point so that they can be published again from their source.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from knnmon.coordinator.service.acks import REJECTS_MAXLEN, reject_record
from knnmon.protocol import (GROUP, entry_order, entry_time_ms, group_info, parse_object,
                                                 redis_clock_ms)
from knnmon.coordinator.recovery.object_log import checkpoint_watermark
from knnmon.errors import InvalidArgumentError, Rejected
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS, Limits

__all__ = ["WatermarkRepair", "repair_watermark"]


@dataclass
class WatermarkRepair:
    """What :func:`repair_watermark` found and did (``dry_run``: would do).

    Attributes
    ----------
    clock_ms
        Redis's clock when the repair ran, epoch ms.
    rejected
        Entry ids of the objects stream rejected as ``future`` and deleted.
    stream_last_id
        The objects stream's last id before and after (equal when it was not ahead).
    reconsidered
        Objects rejected as ``late`` after the first poisoned entry: the next start applies
        those live at the repaired watermark.
    trimmed_below
        The last checkpoint's trim point (entries below it are gone from Redis), if any.
    """

    clock_ms: int
    dry_run: bool
    rejected: list[str] = field(default_factory=list)
    stream_last_id: tuple[str, str] = ("0-0", "0-0")
    reconsidered: int = 0
    trimmed_below: str | None = None
    checkpoint_watermark: str | None = None

    def lines(self) -> list[str]:
        """The repair as readable lines."""
        done = "would be" if self.dry_run else "were"
        out = [f"Redis's clock: {self.clock_ms}",
               f"object entries from the future: {len(self.rejected):,} {done} rejected as `future`"
               + (f" (the first: {self.rejected[0]})" if self.rejected else "")]
        before, after = self.stream_last_id
        if before != after:
            out.append(f"the objects stream's last id {before} {'would be' if self.dry_run else 'was'} set back to "
                       f"{after}")
        out.append(f"objects rejected as late after the first of them: {self.reconsidered:,}; the next start "
                   "applies those live at the repaired watermark (their entries are still in the stream)")
        if self.checkpoint_watermark is not None:
            out.append(f"the checkpoint's watermark {self.checkpoint_watermark} "
                       f"{'would be' if self.dry_run else 'was'} removed")
        if self.trimmed_below and self.rejected:
            out.append(f"a checkpoint trimmed the objects stream below {self.trimmed_below}: objects published "
                       "before it and expired by the poisoned watermark are gone from Redis; publish them again from "
                       "their source if they should still count")
        return out


def _future(eid: str, fields: dict, limits: Limits, clock: int) -> Rejected | None:
    try:
        parse_object(eid, fields, limits, clock_ms=clock)
    except Rejected as r:
        return r if r.reason == "future" else None
    return None


def repair_watermark(client: redis.Redis, keys: Keys, limits: Limits = DEFAULT_LIMITS, *, dry_run: bool = False,
                     chunk: int = 10_000) -> WatermarkRepair:
    """Repair the event time of namespace ``keys`` (module docstring). No service may run there.

    Parameters
    ----------
    limits
        The bounds the service will run with (``limits.max_future_ms``: ``--max-future``).
    dry_run
        Find and report only; change nothing.

    Raises
    ------
    InvalidArgumentError
        ``--max-future off`` (with no bound nothing is from the future), or the stream's last id
        must go back on a Redis Cluster.
    """
    if limits.max_future_ms is None:
        raise InvalidArgumentError("repair --watermark needs a bound: --max-future off makes nothing from the future")
    key = keys.ingest_objects
    clock = redis_clock_ms(client)
    report = WatermarkRepair(clock, dry_run)
    checkpoint = client.hgetall(keys.serve_checkpoint)
    report.trimmed_below = checkpoint.get("trimmed_below")
    raw, watermark = checkpoint_watermark(checkpoint)
    if raw is not None and (watermark is None or watermark - clock > 2 * limits.max_future_ms):
        report.checkpoint_watermark = raw  # ahead of every bound, or not a number
    if not client.exists(key):
        return report
    pending = set()
    group = group_info(client, key)
    if group is not None and group["pending"]:
        pending = {r["message_id"] for r in client.xpending_range(key, GROUP, min="-", max="+",
                                                                  count=group["pending"])}
    poisoned = [(eid, fields, r) for eid, fields in _scan(client, key, chunk)
                if (r := _future(eid, fields, limits, clock)) is not None]
    report.rejected = [eid for eid, _, _ in poisoned]
    info = client.xinfo_stream(key)
    last = info["last-generated-id"]
    report.stream_last_id = (last, last)
    if entry_time_ms(last) - clock > limits.max_future_ms:
        report.stream_last_id = (last, max(_newest_left(client, key, set(report.rejected), chunk), f"{clock}-0",
                                           key=entry_order))
    if report.rejected:
        report.reconsidered = _late_after(client, keys, min(report.rejected, key=entry_order))
    if dry_run:
        return report
    now = int(time.time() * 1000)
    client.delete(keys.serve_settings)  # the stored results held those entries: the next start searches anew
    client.delete(keys.serve_snapshot)  # and the checkpoints' chunks: the next start parses the stream
    for eid, fields, r in poisoned:
        pipe = client.pipeline(transaction=True)
        pipe.xadd(keys.ingest_rejects, reject_record(fields, "future", f"{r} (knnmon repair --watermark)", key, eid),
                  maxlen=REJECTS_MAXLEN, approximate=True)
        if eid in pending:
            pipe.xack(key, GROUP, eid)
        pipe.xdel(key, eid)
        pipe.execute()
    before, after = report.stream_last_id
    if before != after:
        left = set(pending) - set(report.rejected)
        delivered = after if not left else _before(min(left, key=entry_order))
        _rebuild(client, key, delivered, chunk)
    if report.checkpoint_watermark is not None:
        client.hdel(keys.serve_checkpoint, "watermark")
        client.hset(keys.serve_checkpoint, "repaired_ms", now)
    return report


def _before(entry_id: str) -> str:
    """The largest stream entry id below ``entry_id``."""
    ms, seq = entry_order(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"


def _rebuild(client: redis.Redis, key: str, delivered: str, chunk: int) -> None:
    """Stream ``key`` made anew from its entries (same ids): its last id becomes the newest
    entry's, and the consumer group :data:`GROUP` has delivered up to ``delivered``."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        raise InvalidArgumentError(f"{key}'s last id lies in the future; on a Redis Cluster delete the stream's "
                                   "entries from the future and recreate it by hand (RENAME cannot cross slots)")
    tmp = f"{key}:repairing"
    client.delete(tmp)
    pipe = client.pipeline(transaction=False)
    for i, (eid, fields) in enumerate(_scan(client, key, chunk), 1):
        pipe.xadd(tmp, fields, id=eid)
        if i % chunk == 0:
            pipe.execute()
    pipe.execute()
    pipe = client.pipeline(transaction=True)
    pipe.xgroup_create(tmp, GROUP, id=delivered, mkstream=True)
    pipe.rename(tmp, key)
    pipe.execute()


def _newest_left(client: redis.Redis, key: str, gone: set[str], chunk: int) -> str:
    """The newest entry id of stream ``key`` not in ``gone`` (``"0-1"``: none)."""
    end = "+"
    while True:
        got = client.xrevrange(key, max=end, min="-", count=chunk)
        for eid, _ in got:
            if eid not in gone:
                return eid
        if len(got) < chunk:
            return "0-1"
        end = "(" + got[-1][0]


def _late_after(client: redis.Redis, keys: Keys, first: str, chunk: int = 10_000) -> int:
    """How many rejects of reason ``late`` are of object entries after entry ``first``."""
    after = entry_order(first)
    return sum(1 for _, f in _scan(client, keys.ingest_rejects, chunk)
               if f.get("_reason") == "late" and f.get("_stream") == keys.ingest_objects
               and f.get("_entry") and entry_order(f["_entry"]) > after)


def _scan(client: redis.Redis, key: str, chunk: int):
    """Every entry ``(id, fields)`` of stream ``key``, oldest first, read ``chunk`` at a time."""
    start = "-"
    while True:
        entries = client.xrange(key, min=start, max="+", count=chunk)
        yield from entries
        if len(entries) < chunk:
            return
        start = "(" + entries[-1][0]
