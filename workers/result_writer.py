"""Writes a worker's results to Redis: one atomic, exactly-once script call per batch.

Layout: :class:`knnmon.keys.Keys`. A batch's writes travel as one msgpack payload to a Lua script
(``EVALSHA``), which Redis runs atomically, as it would a MULTI/EXEC, and which:

1. returns at once if the worker's idempotency marker already holds this batch's tag, so a
   batch re-sent after a lost reply changes nothing (exactly once);
2. for every changed query: ``ZADD`` the objects that entered its result sorted set (score =
   distance in meters), ``ZREM`` those that left (the whole query hash is written on
   registration, and the id added to the ``queries`` set) -- two commands per changed result,
   nothing else per result;
3. keeps the details of the objects in this worker's results in one hash,
   ``knn:objects:{worker}`` (field: object id, value: ``lon lat t keywords``): one ``HSET`` for
   the objects that entered a result of this worker while none held them, one ``HDEL`` for
   those its last result let go. The writer counts the holders (:attr:`ResultWriter.held`,
   in the worker's memory), so Redis does no per-object work;
4. appends **one** ``changes`` stream entry for the whole call (:mod:`knnmon.feed`: its
   ``version`` and one line per changed query, built by the worker, not by Redis); the stream is
   trimmed (``XTRIM MAXLEN ~``) to about :data:`CHANGES_MAXLEN` changes. A registration (or
   initial load) writes its queries' whole initial results as ``entered``, a deleted query its
   whole result as ``left``: applying ``knn:changes`` from the start reproduces every result's
   members;
5. sets the marker ``<session>:<tag>``;
6. returns the microseconds it ran, for the worker's busy time: the server process's CPU time
   (``os.clock``, Redis 7+, where ``TIME`` stands still inside a script), else ``TIME``.

The first layout (until 2026-11-23) also wrote one stream entry and the query hash's
``version`` per changed result, and kept one hash per object with a reference count of the
results holding it (``HINCRBY`` per object and batch): 19 us of server time per changed result
against 9 here (docs/runtime.md, "Lean writes"). The script addresses keys it builds from the
namespace, so it needs a standalone Redis (not Redis Cluster).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack

from knnmon.batch import BatchChanges, ObjectInfo
from knnmon.connection import connect, with_retries
from knnmon.keys import Keys

__all__ = ["CHANGES_MAXLEN", "ResultWriter"]

#: About how many changes the ``changes`` stream keeps (trimmed by entries, each entry's share
#: estimated from the writer's recent entries).
CHANGES_MAXLEN = 1_000_000
#: The stream keeps at least this many entries whatever their size.
MIN_FEED_ENTRIES = 1_000

_APPLY = """
local os_lib = rawget(_G, 'os')
local clock = os_lib and os_lib.clock
local function now_us()
  if clock then return clock() * 1000000 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local t0 = now_us()
local p = cmsgpack.unpack(ARGV[1])
if redis.call('GET', p.marker) == p.tag then return -1 end
local ns = p.ns
local e, l, f = p.e, p.l, p.f
local ei, li, fi = 1, 1, 1
for j = 1, #p.q do
  local qid = p.q[j]
  local rkey = ns .. ':result:' .. qid
  if p.rep == 1 then redis.call('DEL', rkey) end
  local ne, nl, nf = p.ne[j], p.nl[j], p.nf[j]
  if ne > 0 then redis.call('ZADD', rkey, unpack(e, 2 * ei - 1, 2 * (ei + ne - 1))) end
  if nl > 0 then redis.call('ZREM', rkey, unpack(l, li, li + nl - 1)) end
  if nf > 0 then
    redis.call('HSET', ns .. ':query:' .. qid, unpack(f, fi, fi + nf - 1))
    redis.call('SADD', ns .. ':queries', qid)
    fi = fi + nf
  end
  ei = ei + ne
  li = li + nl
end
local feed = p.feed
for _, qid in ipairs(p.del) do
  local rkey = ns .. ':result:' .. qid
  if redis.call('EXISTS', ns .. ':query:' .. qid) == 1 then
    if #feed > 0 then feed = feed .. '\\n' end
    feed = feed .. qid .. '\\t\\t' .. table.concat(redis.call('ZRANGE', rkey, 0, -1), ' ')
  end
  redis.call('DEL', rkey, ns .. ':query:' .. qid)
  redis.call('SREM', ns .. ':queries', qid)
end
local hs, hd = p.hs, p.hd
for s = 1, #hs, 2000 do redis.call('HSET', p.okey, unpack(hs, s, math.min(s + 1999, #hs))) end
for s = 1, #hd, 1000 do redis.call('HDEL', p.okey, unpack(hd, s, math.min(s + 999, #hd))) end
if p.log == 1 and #feed > 0 then
  redis.call('XADD', ns .. ':changes', '*', 'version', p.version, 'changes', feed)
  redis.call('XTRIM', ns .. ':changes', 'MAXLEN', '~', p.maxlen)
end
redis.call('SET', p.marker, p.tag)
return math.floor(now_us() - t0)
"""


class ResultWriter:
    """Exactly-once Redis writes of one worker (see the module docstring)."""

    def __init__(self, url: str, namespace: str, worker: int | str) -> None:
        self.url, self.keys, self.worker = url, Keys(namespace), worker
        self.client = connect(url)
        self._apply = self.client.register_script(_APPLY)
        self._marker = self.keys.worker_batch(worker)
        self.session = uuid.uuid4().hex[:12]  # markers of earlier runs never match
        self._per_entry = 100.0  # recent changes per feed entry (a moving average), for the trim
        #: Object id -> the results of this worker holding it (as written, or about to be):
        #: whether its details are in ``knn:objects:{worker}``.
        self.held: dict[str, int] = {}

    def apply(self, tag: int, payload: bytes) -> float:
        """One script call with a payload built for ``tag``; returns the server's seconds running
        it (0 for a repeated tag)."""
        # The script ignores a tag it has applied already, so a plain retry is exactly-once.
        us = with_retries(lambda: self._apply(args=[payload]), f"writing batch {tag} of worker {self.worker}", self.url)
        return max(int(us), 0) / 1e6

    def hold(self, oids: Iterable[str]) -> None:
        """Count results that hold ``oids`` without writing (a worker rebuilt from what Redis
        holds: its objects' details are there already)."""
        held = self.held
        for oid in oids:
            held[oid] = held.get(oid, 0) + 1

    def _holds(self, changes: BatchChanges, released: Sequence[str], details: bool) -> tuple[list[str], list[str]]:
        """Count the changes' holders; ``(HSET arguments, HDEL ids)`` of the details hash: the
        objects no result of this worker held before, and those none holds after (``released``:
        the members of deleted results). ``details=False``: counted, not written."""
        held, fresh, gone = self.held, [], []
        for oid in changes.entered:
            n = held.get(oid, 0)
            if n == 0:
                fresh.append(oid)
            held[oid] = n + 1
        for oid in [*changes.left, *released]:
            n = held.get(oid, 0) - 1
            if n > 0:
                held[oid] = n
            else:
                held.pop(oid, None)
                gone.append(oid)
        if not details:
            return [], []
        hs: list[str] = []
        for oid in fresh:
            if oid in held:  # (held still: entered, and not let go again in the same call)
                hs += [oid, changes.objects[oid].to_text()]
        return hs, gone

    def _payload(self, tag: int, changes: BatchChanges, *, fields: Sequence[Sequence[str]] | None = None,
                 replace: bool = False, log: bool = True, delete: Sequence[str] = (), released: Sequence[str] = (),
                 details: bool = True, extra_details: Sequence[str] = ()) -> bytes:
        """The msgpack payload of one script call: ``changes``; per changed query its hash
        ``fields`` (key, value, ...; registration); ``replace`` their results first; ``log`` the
        changes in the feed; ``delete`` queries with their keys (``released``: their members);
        ``details`` keep ``knn:objects:{worker}``; ``extra_details`` more HSET arguments."""
        c = changes
        n = len(c.qids)
        e: list[Any] = [None] * (2 * len(c.entered))  # ZADD's score, member pairs
        e[0::2], e[1::2] = c.distances, c.entered
        fields = fields or [()] * n
        if n:
            self._per_entry = 0.9 * self._per_entry + 0.1 * n
        hs, hd = self._holds(c, released, details)
        return msgpack.packb({
            "ns": self.keys.namespace, "marker": self._marker, "tag": f"{self.session}:{tag}",
            "maxlen": max(MIN_FEED_ENTRIES, int(CHANGES_MAXLEN / max(self._per_entry, 1.0))), "log": int(log),
            "del": list(delete), "q": list(c.qids), "rep": int(replace), "ne": list(c.n_entered), "e": e,
            "nl": list(c.n_left), "l": list(c.left), "nf": [len(f) for f in fields],
            "f": [x for f in fields for x in f], "okey": self.keys.objects(self.worker), "hs": hs + list(extra_details),
            "hd": hd, "feed": c.feed_text() if log else "", "version": int(c.version),
        })

    def write_queries(self, tag: int, queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                      objects: Mapping[str, ObjectInfo], version: int = 0) -> None:
        """Write queries with their whole results (registration, initial load).

        ``queries``: ``(qid, query hash fields, [(oid, distance m), ...])``; ``objects``: the
        details of every object in them; ``version``: the feed's
        (:class:`~knnmon.batch.BatchChanges`). Ids this writer holds no result of.
        """
        self.apply(tag, self.queries_payload(tag, queries, objects, version))

    def queries_payload(self, tag: int,
                        queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                        objects: Mapping[str, ObjectInfo], version: int = 0) -> bytes:
        """The payload of :meth:`write_queries`, for :meth:`apply` (e.g. on another thread)."""
        diffs, fields = [], []
        for qid, f, topk in queries:
            diffs.append((qid, topk, ()))
            fields.append([x for key, value in {**f, "worker": self.worker}.items() for x in (key, str(value))])
        return self._payload(tag, BatchChanges.from_diffs(diffs, objects, version), fields=fields, replace=True)

    def details_payload(self, tag: int, objects: Mapping[str, ObjectInfo]) -> bytes:
        """A payload writing only ``objects``' details (a resumed service's workers, whose
        queries the new plan may have moved: each writes the objects it holds)."""
        hs = [x for oid, o in objects.items() for x in (oid, o.to_text())]
        return self._payload(tag, BatchChanges([], [], [], [], [], []), log=False, extra_details=hs)

    def write_batch(self, tag: int, changes: BatchChanges) -> float:
        """Write one batch's result changes (module docstring); returns the server's seconds
        running the script."""
        return self.apply(tag, self._payload(tag, changes))

    def write_repairs(self, tag: int, changes: BatchChanges) -> float:
        """Write result changes without touching any worker's object details (recovery's
        repairs: the workers write their details when they resume)."""
        return self.apply(tag, self._payload(tag, changes, details=False))

    def delete_query(self, tag: int, qid: str, version: int = 0, members: Sequence[str] = ()) -> None:
        """Delete a query's keys; its feed line (at ``version``) lists what Redis held; its
        ``members`` (as this worker holds them) are let go."""
        self.apply(tag, self._payload(tag, BatchChanges([], [], [], [], [], [], version=version), delete=[qid],
                                      released=members))

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
