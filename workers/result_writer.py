"""Writes a worker's results to Redis: one MULTI/EXEC per batch, exactly once.

Layout: :class:`knnmon.keys.Keys`. Per batch, in one transaction: for every changed query its
result sorted set (``ZADD`` the objects that entered, ``ZREM`` those that left), its ``version``
in the query hash, and one ``changes`` stream entry (``qid``, ``entered``, ``left``, ``version``);
the hashes of objects that entered a result (``refs`` counts the results holding an object; the
hash is deleted when it drops to 0); and the worker's idempotency marker
``worker_batch(w) = <session>:<batch>``. A transaction whose reply was lost is not sent again if its marker
is already in Redis, so a retry never duplicates a change entry or a reference count.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from knnmon.connection import connect, with_retries
from knnmon.keys import Keys

__all__ = ["ResultWriter", "Change", "ObjectInfo"]

#: Approximate cap of the ``changes`` stream (XADD MAXLEN ~).
CHANGES_MAXLEN = 1_000_000

_RELEASE = """
local n = redis.call('HINCRBY', KEYS[1], 'refs', -1)
if n <= 0 then redis.call('DEL', KEYS[1]) end
return n
"""


@dataclass(frozen=True)
class ObjectInfo:
    """What ``knn:object:{oid}`` holds: degrees, epoch ms, keywords."""

    lon: float
    lat: float
    t: int
    keywords: Sequence[str]


@dataclass(frozen=True)
class Change:
    """One query's result change in a batch: objects entered (with distances in meters) and left."""

    qid: str
    version: int
    entered: Sequence[tuple[str, float]]
    left: Sequence[str]


class ResultWriter:
    """Exactly-once Redis writes of one worker (see the module docstring)."""

    def __init__(self, url: str, namespace: str, worker: int) -> None:
        self.url, self.keys, self.worker = url, Keys(namespace), worker
        self.client = connect(url)
        self._release = self.client.register_script(_RELEASE)
        self._marker = self.keys.worker_batch(worker)
        self.session = uuid.uuid4().hex[:12]  # markers of earlier runs never match

    def _transaction(self, tag: int, fill) -> None:
        """Run ``fill(pipe)`` in MULTI/EXEC with marker ``tag``; retried exactly once in effect."""

        def op() -> None:
            pipe = self.client.pipeline(transaction=True)
            fill(pipe)
            pipe.set(self._marker, f"{self.session}:{tag}")
            pipe.execute()

        def applied() -> bool:
            return self.client.get(self._marker) == f"{self.session}:{tag}"

        with_retries(op, f"writing batch {tag} of worker {self.worker}", self.url, before_retry=applied)

    def _put_object(self, pipe, oid: str, info: ObjectInfo) -> None:
        key = self.keys.object(oid)
        pipe.hset(key, mapping={"lon": repr(float(info.lon)), "lat": repr(float(info.lat)), "t": int(info.t),
                                "keywords": " ".join(info.keywords)})
        pipe.hincrby(key, "refs", 1)

    def write_queries(self, tag: int, queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                      objects: Mapping[str, ObjectInfo]) -> None:
        """Write queries with their whole results (registration, initial load).

        ``queries``: ``(qid, query hash fields, [(oid, distance m), ...])``. Any previous result
        of the same ids is replaced (callers unregister first to release its objects).
        """

        def fill(pipe) -> None:
            for qid, fields, topk in queries:
                pipe.delete(self.keys.result(qid))
                if topk:
                    pipe.zadd(self.keys.result(qid), {oid: dist for oid, dist in topk})
                pipe.hset(self.keys.query(qid), mapping={**fields, "worker": self.worker})
                for oid, _ in topk:
                    self._put_object(pipe, oid, objects[oid])

        self._transaction(tag, fill)

    def write_changes(self, tag: int, changes: Sequence[Change], objects: Mapping[str, ObjectInfo]) -> None:
        """Write one batch's result changes (module docstring)."""

        def fill(pipe) -> None:
            for c in changes:
                rkey = self.keys.result(c.qid)
                if c.entered:
                    pipe.zadd(rkey, {oid: dist for oid, dist in c.entered})
                    for oid, _ in c.entered:
                        self._put_object(pipe, oid, objects[oid])
                if c.left:
                    pipe.zrem(rkey, *c.left)
                    for oid in c.left:
                        self._release(keys=[self.keys.object(oid)], client=pipe)
                pipe.hset(self.keys.query(c.qid), "version", c.version)
                pipe.xadd(self.keys.changes, {"qid": c.qid, "entered": " ".join(o for o, _ in c.entered),
                                              "left": " ".join(c.left), "version": c.version},
                          maxlen=CHANGES_MAXLEN, approximate=True)

        self._transaction(tag, fill)

    def delete_query(self, tag: int, qid: str, result: Sequence[str]) -> None:
        """Delete a query's keys and release the objects of its result."""

        def fill(pipe) -> None:
            pipe.delete(self.keys.result(qid), self.keys.query(qid))
            for oid in result:
                self._release(keys=[self.keys.object(oid)], client=pipe)

        self._transaction(tag, fill)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
