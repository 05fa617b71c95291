"""Writes a worker's results to Redis: one atomic, exactly-once script call per batch.

Layout: :class:`knnmon.keys.Keys`. A batch's writes travel as one msgpack payload to a Lua script
(``EVALSHA``), which Redis runs atomically, as it would a MULTI/EXEC, and which:

1. returns at once if the worker's idempotency marker already holds this batch's tag, so a
   batch re-sent after a lost reply changes nothing (exactly once);
2. for every changed query: ``ZADD`` the objects that entered its result sorted set (score =
   distance in meters), ``ZREM`` those that left (the whole query hash is written on
   registration, and the id added to the ``queries`` set), sets the hash's ``version`` (the
   query's change count) and appends one ``changes`` stream entry (``qid``, ``entered``,
   ``left``, ``version``); the stream is trimmed (``XTRIM MAXLEN ~``) once per call, not per
   entry (docs/runtime.md has the measurements behind this and the payload design);
   A registration (or initial load) writes one entry with the whole initial result as
   ``entered`` and version 0, a deleted query one with its whole result as ``left`` and the
   next version: applying ``knn:changes`` from the start reproduces every result's members;
3. counts in an object's ``refs`` the results holding it (the batch's net change per object, one
   ``HINCRBY`` each), writes the object's hash when the first result takes it, and deletes the
   hash when the last one lets it go;
4. sets the marker ``<session>:<tag>``;
5. returns the microseconds it ran (server clock), for the worker's busy time.

One payload replaces thousands of pipelined commands. The script addresses keys it builds from
the namespace, so it needs a standalone Redis (not Redis Cluster).
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

#: Approximate cap of the ``changes`` stream (XTRIM MAXLEN ~ after each batch).
CHANGES_MAXLEN = 1_000_000

_APPLY = """
local t0 = redis.call('TIME')
local p = cmsgpack.unpack(ARGV[1])
if redis.call('GET', p.marker) == p.tag then return -1 end
local ns = p.ns
local obj = p.obj
local at = {}
for i = 1, #obj, 5 do at[obj[i]] = i end
local e, eid, l, f = p.e, p.eid, p.l, p.f
local ei, li, fi = 1, 1, 1
for j = 1, #p.q do
  local qid = p.q[j]
  local rkey = ns .. ':result:' .. qid
  if p.rep[j] == 1 then redis.call('DEL', rkey) end
  local ne, nl, nf = p.ne[j], p.nl[j], p.nf[j]
  if ne > 0 then redis.call('ZADD', rkey, unpack(e, 2 * ei - 1, 2 * (ei + ne - 1))) end
  if nl > 0 then redis.call('ZREM', rkey, unpack(l, li, li + nl - 1)) end
  if nf > 0 then
    redis.call('HSET', ns .. ':query:' .. qid, unpack(f, fi, fi + nf - 1))
    redis.call('SADD', ns .. ':queries', qid)
    fi = fi + nf
  end
  if p.log == 1 then
    redis.call('HSET', ns .. ':query:' .. qid, 'version', p.v[j])
    redis.call('XADD', ns .. ':changes', '*', 'qid', qid,
               'entered', table.concat(eid, ' ', ei, ei + ne - 1), 'left', table.concat(l, ' ', li, li + nl - 1),
               'version', p.v[j])
  end
  ei = ei + ne
  li = li + nl
end
for i = 1, #p.ro do
  local okey = ns .. ':object:' .. p.ro[i]
  local n = redis.call('HINCRBY', okey, 'refs', p.rd[i])
  if n <= 0 then
    redis.call('DEL', okey)
  elseif n == p.rd[i] then
    local o = at[p.ro[i]]
    redis.call('HSET', okey, 'lon', obj[o + 1], 'lat', obj[o + 2], 't', obj[o + 3], 'keywords', obj[o + 4])
  end
end
for _, qid in ipairs(p.del) do
  local rkey = ns .. ':result:' .. qid
  local members = redis.call('ZRANGE', rkey, 0, -1)
  for _, oid in ipairs(members) do
    local okey = ns .. ':object:' .. oid
    if redis.call('HINCRBY', okey, 'refs', -1) <= 0 then redis.call('DEL', okey) end
  end
  if p.log == 1 and redis.call('EXISTS', ns .. ':query:' .. qid) == 1 then
    local v = tonumber(redis.call('HGET', ns .. ':query:' .. qid, 'version') or '0') + 1
    redis.call('XADD', ns .. ':changes', '*', 'qid', qid, 'entered', '', 'left', table.concat(members, ' '),
               'version', v)
  end
  redis.call('DEL', rkey, ns .. ':query:' .. qid)
  redis.call('SREM', ns .. ':queries', qid)
end
if p.log == 1 then redis.call('XTRIM', ns .. ':changes', 'MAXLEN', '~', p.maxlen) end
redis.call('SET', p.marker, p.tag)
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])
"""


class ResultWriter:
    """Exactly-once Redis writes of one worker (see the module docstring)."""

    def __init__(self, url: str, namespace: str, worker: int) -> None:
        self.url, self.keys, self.worker = url, Keys(namespace), worker
        self.client = connect(url)
        self._apply = self.client.register_script(_APPLY)
        self._marker = self.keys.worker_batch(worker)
        self.session = uuid.uuid4().hex[:12]  # markers of earlier runs never match

    def apply(self, tag: int, payload: bytes) -> float:
        """One script call with a payload built for ``tag``; returns the server's seconds running
        it (0 for a repeated tag)."""
        # The script ignores a tag it has applied already, so a plain retry is exactly-once.
        us = with_retries(lambda: self._apply(args=[payload]), f"writing batch {tag} of worker {self.worker}", self.url)
        return max(int(us), 0) / 1e6

    def _payload(self, tag: int, changes: BatchChanges, *, fields: Sequence[Sequence[str]] | None = None,
                 replace: bool = False, log: bool = True, delete: Sequence[str] = ()) -> bytes:
        """The msgpack payload of one script call: ``changes``; per changed query its hash
        ``fields`` (key, value, ...; registration); ``replace`` its result first; ``log`` a
        ``changes`` entry per query and its ``version``; ``delete`` queries with their keys."""
        c = changes
        n = len(c.qids)
        e: list[Any] = [None] * (2 * len(c.entered))  # ZADD's score, member pairs
        e[0::2], e[1::2] = c.distances, c.entered
        obj: list[Any] = []
        for oid, o in c.objects.items():
            obj += [oid, repr(float(o.lon)), repr(float(o.lat)), str(int(o.t)), " ".join(o.keywords)]
        fields = fields or [()] * n
        return msgpack.packb({
            "ns": self.keys.namespace, "marker": self._marker, "tag": f"{self.session}:{tag}",
            "maxlen": CHANGES_MAXLEN, "log": int(log), "del": list(delete), "obj": obj,
            "q": list(c.qids), "v": list(c.versions), "rep": [int(replace)] * n, "ne": list(c.n_entered), "e": e,
            "eid": list(c.entered), "nl": list(c.n_left), "l": list(c.left), "nf": [len(f) for f in fields],
            "f": [x for f in fields for x in f], "ro": list(c.ref_ids), "rd": list(c.ref_deltas),
        })

    def write_queries(self, tag: int, queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                      objects: Mapping[str, ObjectInfo]) -> None:
        """Write queries with their whole results (registration, initial load).

        ``queries``: ``(qid, query hash fields, [(oid, distance m), ...])``. A previous result of
        the same id is replaced (callers unregister first to release its objects).
        """
        self.apply(tag, self.queries_payload(tag, queries, objects))

    def queries_payload(self, tag: int,
                        queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                        objects: Mapping[str, ObjectInfo]) -> bytes:
        """The payload of :meth:`write_queries`, for :meth:`apply` (e.g. on another thread)."""
        diffs, fields = [], []
        for qid, f, topk in queries:
            diffs.append((qid, int(f.get("version", 0)), topk, ()))
            fields.append([x for key, value in {**f, "worker": self.worker}.items() for x in (key, str(value))])
        return self._payload(tag, BatchChanges.from_diffs(diffs, objects), fields=fields, replace=True)

    def write_batch(self, tag: int, changes: BatchChanges) -> float:
        """Write one batch's result changes (module docstring); returns the server's seconds
        running the script."""
        return self.apply(tag, self._payload(tag, changes))

    def delete_query(self, tag: int, qid: str) -> None:
        """Delete a query's keys and release the objects of its result (read by the script)."""
        self.apply(tag, self._payload(tag, BatchChanges([], [], [], [], [], [], []), delete=[qid]))

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
