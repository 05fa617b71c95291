"""The service's intake: read the ingest streams, and turn a read of object entries into the
objects to apply and the entries to reject, each with its reason.

Reads are ``XREADGROUP`` as consumer ``config.consumer`` of the group :data:`~knnmon.protocol.GROUP`;
parsing and the field rejects are the stream protocol's, in bulk (:func:`~knnmon.bulk_parse.parse_objects`);
which objects are duplicates or late is the runtime's one rule (:meth:`Runtime.admit
<knnmon.coordinator.runtime.runtime.Runtime.admit>`), turned here into ``duplicate_id`` and
``late`` rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import redis
from redis.cluster import RedisCluster

from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.bulk_parse import parse_objects
from knnmon.errors import Rejected
from knnmon.limits import Limits
from knnmon.protocol import GROUP, entry_order, redis_clock_ms

__all__ = ["CLUSTER_BLOCK_MS", "Entry", "ObjectRead", "Reject", "StreamReader", "read_objects"]

#: In a Redis Cluster, the longest an idle service blocks on the objects stream alone (ms).
CLUSTER_BLOCK_MS = 100

#: A stream entry: its id and fields (``{}``: deleted while pending).
Entry = tuple[str, dict]
#: A rejected entry: its id, fields and why.
Reject = tuple[str, dict, Rejected]


class StreamReader:
    """``XREADGROUP`` of the ingest streams for one consumer of the group."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        self.client = client
        self.consumer = consumer
        #: Each stream -> the newest entry id read from it so far.
        self.last_ids: dict[str, str] = {}

    def read(self, streams: dict[str, str], count: int, block_ms: int | None) -> list[tuple[str, list[Entry]]]:
        """Entries of ``streams`` (key -> start id) as ``[(key, [(id, fields), ...]), ...]``; an
        entry deleted while pending comes back with no fields (``{}``: rejected by the parser).
        In a Redis Cluster the streams hash to different slots, so one XREADGROUP each: without
        blocking, then, if all were empty, blocking on the last one (the objects stream) for at
        most :data:`CLUSTER_BLOCK_MS` (a query operation arriving meanwhile waits that long)."""
        client = self.client
        if len(streams) == 1 or not isinstance(client, RedisCluster):
            got = client.xreadgroup(GROUP, self.consumer, streams, count=count, block=block_ms) or []
        else:
            got = [x for key, start in streams.items()
                   for x in client.xreadgroup(GROUP, self.consumer, {key: start}, count=count) or [] if x[1]]
            if not got and block_ms is not None:
                key, start = list(streams.items())[-1]
                got = client.xreadgroup(GROUP, self.consumer, {key: start}, count=count,
                                        block=min(block_ms, CLUSTER_BLOCK_MS)) or []
        for key, entries in got:
            if entries and (key not in self.last_ids or entry_order(entries[-1][0]) > entry_order(self.last_ids[key])):
                self.last_ids[key] = entries[-1][0]
        return [(key, [(eid, fields or {}) for eid, fields in entries]) for key, entries in got]


@dataclass
class ObjectRead:
    """A read of object entries, parsed (:func:`read_objects`).

    Attributes
    ----------
    objects
        The objects to apply (:data:`~knnmon.bulk_parse.OBJECT_SCHEMA`),
        in entry order.
    entry_ids
        ``(n,)`` their entries' ids.
    rejects
        The rejected entries: the protocol's and the duplicates in entry order, then the late ones.
    late
        How many of ``rejects`` are ``late``.
    """

    objects: pa.Table
    entry_ids: list[str]
    rejects: list[Reject]
    late: int


def read_objects(entries: list[Entry], runtime: Runtime, limits: Limits, client: redis.Redis) -> ObjectRead:
    """Parse a read's object entries in bulk (:func:`~knnmon.bulk_parse.parse_objects`, the
    recovery's parser); reject the malformed ones, those from the future (against Redis's clock,
    read once), the duplicates and the late ones."""
    clock = redis_clock_ms(client) if limits.max_future_ms is not None else None
    cols = parse_objects(entries, limits, clock_ms=clock)
    at = np.flatnonzero(cols.ok)  # each parsed object's position in entries
    ids = [cols.ids[i] for i in at.tolist()]
    admitted = runtime.admit(ids, cols.t[at])
    rejects = [(i, (*entries[i], r)) for i, r in cols.rejects.items()]
    rejects += [(int(at[j]), (*entries[at[j]], Rejected("duplicate_id", f"id={ids[j]}")))
                for j in np.flatnonzero(admitted.duplicate).tolist()]
    rejects.sort(key=lambda r: r[0])
    late = []
    if admitted.late.any():
        why = " (watermark: the largest t - the allowed lateness)" if runtime.window.lateness_ms else ""
        late = [(*entries[at[j]], Rejected("late", f"t={cols.t[at[j]]} <= watermark - window = {admitted.cutoff}{why}"))
                for j in np.flatnonzero(admitted.late).tolist()]
    keep = at[~(admitted.duplicate | admitted.late)]
    return ObjectRead(cols.table(keep), [entries[i][0] for i in keep.tolist()], [r for _, r in rejects] + late,
                      len(late))
