"""Writes a worker's results to Redis: one atomic, exactly-once script call per batch.

Layout: :class:`knnmon.keys.Keys`. A batch's writes travel as one msgpack payload to a Lua script
(``EVALSHA``), which Redis runs atomically, as it would a MULTI/EXEC, and which:

1. returns at once if the worker's idempotency marker already holds this batch's tag, so a
   batch re-sent after a lost reply changes nothing (exactly once);
2. for every changed query: ``ZADD`` the objects that entered its result sorted set (score =
   distance in meters), ``ZREM`` those that left (the whole query hash is written on
   registration, and the id added to the ``queries`` set; a deleted query's result and hash are
   deleted, its id removed) -- two commands per changed result, nothing else per result;
3. keeps the details of the objects in this worker's results in one hash,
   ``knn:objects:{worker}`` (field: object id, value: ``lon lat t keywords``): one ``HSET`` for
   the objects that entered a result of this worker while none held them, one ``HDEL`` for
   those its last result let go. The worker counts the holders (:mod:`knnmon.workers.holders`,
   an int32 array per object handle) and the write carries the result
   (:attr:`knnmon.batch.BatchChanges.details`), so Redis does no per-object work; a writer used
   alone counts them itself by id;
4. appends **one** ``changes`` stream entry for the whole call (:mod:`knnmon.feed`: its
   ``version`` and one line per changed query, built by the worker, not by Redis; a deleted
   query's line lets go of the result the worker held); the stream is
   trimmed (``XTRIM MAXLEN ~``) to about :data:`CHANGES_MAXLEN` changes, and to about the
   last :data:`CHANGES_KEEP_MS` of them (``XTRIM MINID ~``, keeping at least
   :data:`MIN_FEED_ENTRIES` entries). A registration (or
   initial load) writes its queries' whole initial results as ``entered``, a deleted query its
   whole result as ``left``: applying ``knn:changes`` from the start reproduces every result's
   members;
5. sets the marker ``<session>:<tag>``;
6. returns the microseconds it ran, for the worker's busy time: the server process's CPU time
   (``os.clock``, Redis 7+, where ``TIME`` stands still inside a script), else ``TIME``.

In a **Redis Cluster** the keys keep their names, so one batch's keys live on several masters:
the payload is cut by master (:meth:`~knnmon.workers.write_script.ClusterWrites.split`) and each
master runs the same script on its part, in one call per master and batch; the feed goes to its
master last. Every master
keeps the worker's marker (a key in one of its slots, :meth:`knnmon.keys.Keys.worker_batch`),
so a re-sent batch changes nothing on a master that applied it, and a revival can tell a batch
that reached only some masters (:func:`knnmon.coordinator.recovery.revival.last_applied_batch`).

The first layout (until 2026-11-23) also wrote one stream entry and the query hash's
``version`` per changed result, and kept one hash per object with a reference count of the
results holding it (``HINCRBY`` per object and batch): 19 us of server time per changed result
against 9 here (docs/concepts.md, "Redis layout").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import msgpack
import numpy as np

from redis.cluster import RedisCluster

from knnmon.batch import BatchChanges, ObjectInfo
from knnmon.connection import connect, with_retries
from knnmon.keys import Keys
from knnmon.workers.holders import Details, Holders, texts_of
from knnmon.workers.write_script import APPLY, PAYLOAD_VERSION, ClusterWrites, WritePayload

__all__ = ["CHANGES_KEEP_MS", "CHANGES_MAXLEN", "ResultWriter", "details_key"]

#: About how many changes the ``changes`` stream keeps (trimmed by entries, each entry's share
#: estimated from the writer's recent entries).
CHANGES_MAXLEN = 1_000_000
#: About how long the ``changes`` stream keeps a change, ms (entries older than the newest by
#: more are trimmed, ``XTRIM MINID ~``): a reader further behind re-reads the results. A bound by
#: time fills once, in the first minutes, whatever the rate of changes.
CHANGES_KEEP_MS = 5 * 60_000
#: The stream keeps at least this many entries whatever their size and age.
MIN_FEED_ENTRIES = 1_000

def details_key(keys: Keys, worker: int | str, qid: str, masters=None) -> str:
    """The hash holding the details of the objects in query ``qid``'s result when worker
    ``worker`` serves it: ``knn:objects:{worker}``; in a Redis Cluster (``masters``: its
    :class:`~knnmon.redis_cluster.MasterMap`) one per worker and master, on the master of the
    query's result key (``knn:objects:{worker}{<tag>}``), so that details are written where the
    results are. The query hash's ``objects`` field names it."""
    if masters is None:
        return keys.objects(worker)
    return keys.objects(worker, masters.tag_of(masters.master_of(keys.result(qid))))


class ResultWriter:
    """Exactly-once Redis writes of one worker (see the module docstring).

    Parameters
    ----------
    url : str
        The results store: a standalone Redis, or any node of a Redis Cluster (then one script
        call per master and batch: :meth:`apply`).
    namespace : str
        Key prefix (:class:`~knnmon.keys.Keys`).
    worker : int or str
        The worker's id (its details hash, its idempotency markers).
    """

    def __init__(self, url: str, namespace: str, worker: int | str) -> None:
        self.url, self.keys, self.worker = url, Keys(namespace), worker
        self.client = connect(url)
        self.masters = None
        if isinstance(self.client, RedisCluster):
            from knnmon.redis_cluster import MasterMap

            self.masters = MasterMap(self.client)
            self._cluster = ClusterWrites(self.masters, self.keys, worker, self.bucket_key)
        else:
            self._apply = self.client.register_script(APPLY)
        self._marker = self.keys.worker_batch(worker)
        self.session = uuid.uuid4().hex[:12]  # markers of earlier runs never match
        self._per_entry = 100.0  # recent changes per feed entry (a moving average), for the trim
        #: The holder counts of a writer used alone (:meth:`_details`), with its own handles.
        self._own: tuple[Holders, dict[str, int], list[str]] | None = None
        #: The marker value of the last write that succeeded (``None``: none yet), and whether a
        #: write failed since: :meth:`last_write`.
        self._last: str | None = None
        self._failed = False

    def last_write(self) -> tuple[str | None, bool]:
        """The marker value (``<session>:<tag>``) its last successful write left in Redis
        (``None``: no write yet), and whether a write failed after it: a service that lost its
        Redis for a while asks, to tell whether the Redis that came back kept every write."""
        return self._last, self._failed

    def apply(self, tag: int | str, payload: WritePayload) -> float:
        """One script call with a payload built for ``tag`` (a batch's number; one per master in
        a cluster: see :meth:`_apply_cluster`); returns the server's seconds running it (0 for a repeated tag).

        Raises
        ------
        StoreUnavailableError
            Redis unreachable after every retry.
        """
        try:
            seconds = self._apply_cluster(tag, payload) if self.masters is not None else self._apply_one(tag, payload)
        except BaseException:
            self._failed = True
            raise
        self._last, self._failed = f"{self.session}:{tag}", False
        return seconds

    def _apply_one(self, tag: int | str, payload: WritePayload) -> float:
        """:meth:`apply` on a standalone Redis."""
        okey = self.keys.objects(self.worker)
        hs, hd = payload["dets"].get(okey, ([], []))
        packed = msgpack.packb({**payload, "dets": None, "okey": okey, "hs": hs, "hd": hd, "marker": self._marker,
                                "tag": f"{self.session}:{tag}"})
        # The script ignores a tag it has applied already, so a plain retry is exactly-once.
        us = with_retries(lambda: self._apply(args=[packed]), f"writing batch {tag} of worker {self.worker}", self.url)
        return max(int(us), 0) / 1e6

    def _apply_cluster(self, tag: int | str, payload: WritePayload) -> float:
        """The cluster's :meth:`apply`: one script call per master (:class:`ClusterWrites`),
        retried whole while Redis is unreachable (exactly once: each master's marker)."""
        return with_retries(lambda: self._cluster.apply(payload, f"{self.session}:{tag}"),
                            f"writing batch {tag} of worker {self.worker}", self.url)

    @property
    def held(self) -> dict[str, int]:
        """Object id -> the results holding it, as counted by this writer itself (a writer used
        alone; a worker counts its own: :mod:`knnmon.workers.holders`)."""
        if self._own is None:
            return {}
        holders, _, names = self._own
        n = holders.by_handle()
        return {names[h]: int(n[h]) for h in np.flatnonzero(n).tolist()}

    def bucket(self, qid: str) -> str:
        """Which details hash holds the details of ``qid``'s result: ``""`` (standalone), else
        the master of its result key."""
        return "" if self.masters is None else self.masters.master_of(self.keys.result(qid))

    def details_key(self, qid: str) -> str:
        """The hash holding the details of the objects in ``qid``'s result
        (:func:`details_key`)."""
        return details_key(self.keys, self.worker, qid, self.masters)

    def bucket_key(self, bucket: str) -> str:
        """The key of the details hash of ``bucket`` (:meth:`bucket`)."""
        return self.keys.objects(self.worker, self.masters.tag_of(bucket) if bucket else None)

    def holders(self) -> Holders:
        """A new :class:`~knnmon.workers.holders.Holders` for this writer's details hashes."""
        return Holders(self.bucket_key, self.bucket if self.masters is not None else None)

    def _details(self, c: BatchChanges, released: Sequence[str], delete: str | None) -> Mapping[str, tuple]:
        """What ``c`` does to the details hashes: ``c.details`` if its maker counted the
        holders, else counted here by id (the deleted query ``delete``'s members ``released``
        let go too)."""
        if c.details is not None:
            return c.details
        if self._own is None:
            self._own = (self.holders(), {}, [])
        holders, handle_of, names = self._own

        def handles(oids: Sequence[str]) -> np.ndarray:
            out = np.empty(len(oids), dtype=np.int64)
            for i, oid in enumerate(oids):
                h = handle_of.get(oid)
                if h is None:
                    h = handle_of[oid] = len(names)
                    names.append(oid)
                out[i] = h
            return out

        qb = holders.buckets(list(c.qids))
        left, l_b = list(c.left), np.repeat(qb, np.asarray(c.n_left, dtype=np.int64))
        if delete is not None:
            left += released
            l_b = np.concatenate([l_b, np.repeat(holders.buckets([delete]), len(released))])
        return holders.change(handles(c.entered), np.repeat(qb, np.asarray(c.n_entered, dtype=np.int64)),
                              handles(left), l_b, lambda h: [names[i] for i in h.tolist()], texts_of(c.objects))

    def _payload(self, changes: BatchChanges, *, fields: Sequence[Sequence[str]] | None = None,
                 replace: bool = False, log: bool = True, delete: str | None = None,
                 released: Sequence[str] = ()) -> WritePayload:
        """The payload of one script call (a dict; :meth:`apply` packs it): ``changes`` (with
        what they do to the details hashes: :meth:`_details`); per changed query its hash
        ``fields`` (key, value, ...; registration); ``replace`` their results first; ``log`` the
        changes in the feed; ``delete`` a query with its keys (``released``: its members, as
        this worker holds them, for its feed line)."""
        c = changes
        n = len(c.qids)
        e: list[Any] = [None] * (2 * len(c.entered))  # ZADD's score, member pairs
        e[0::2], e[1::2] = c.distances, c.entered
        fields = fields or [()] * n
        if n and log:
            self._per_entry = 0.9 * self._per_entry + 0.1 * n
        dets = self._details(c, released, delete)
        hq = [q for q, f in zip(c.qids, fields) if f]
        feed = c.feed_text() if log else ""
        if delete is not None:
            feed = "\n".join(x for x in (feed, f"{delete}\t\t{' '.join(released)}") if x)
        return {
            "pv": PAYLOAD_VERSION, "ns": self.keys.namespace,
            "maxlen": max(MIN_FEED_ENTRIES, int(CHANGES_MAXLEN / max(self._per_entry, 1.0))),
            "keepms": CHANGES_KEEP_MS, "minentries": MIN_FEED_ENTRIES,
            "q": list(c.qids), "rep": int(replace), "ne": list(c.n_entered), "e": e, "nl": list(c.n_left),
            "l": list(c.left), "hq": hq, "nf": [len(f) for f in fields if f], "f": [x for f in fields for x in f],
            "dr": [delete] if delete is not None else [], "dq": [delete] if delete is not None else [],
            "sa": hq, "sr": [delete] if delete is not None else [], "dets": dets, "feed": feed,
            "version": int(c.version),
        }

    def write_queries(self, tag: int, queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                      objects: Mapping[str, ObjectInfo], version: int = 0, details: Details | None = None) -> None:
        """Write queries with their whole results (registration, initial load).

        ``queries``: ``(qid, query hash fields, [(oid, distance m), ...])``; ``objects``: the
        details of every object in them; ``version``: the feed's
        (:class:`~knnmon.batch.BatchChanges`); ``details``: what the write does to the details
        hashes, if the caller counted the holders (:attr:`BatchChanges.details`). Ids this
        writer holds no result of.
        """
        self.apply(tag, self.queries_payload(tag, queries, objects, version, details))

    def queries_payload(self, tag: int,
                        queries: Iterable[tuple[str, Mapping[str, object], Sequence[tuple[str, float]]]],
                        objects: Mapping[str, ObjectInfo], version: int = 0,
                        details: Details | None = None) -> WritePayload:
        """The payload of :meth:`write_queries`, for :meth:`apply` (e.g. on another thread)."""
        qids, n_entered, entered, distances, fields = [], [], [], [], []
        for qid, f, topk in queries:
            qids.append(qid)
            n_entered.append(len(topk))
            entered += [o for o, _ in topk]
            distances += [float(d) for _, d in topk]
            fields.append(f)
        c = BatchChanges(qids, n_entered, entered, distances, [0] * len(qids), [], objects, version, details)
        return self.whole_payload(c, fields)

    def whole_payload(self, changes: BatchChanges, fields: Sequence[Mapping[str, object]]) -> WritePayload:
        """The payload writing the queries ``changes.qids`` whole (:meth:`queries_payload`):
        each one's hash ``fields`` (with this worker's ``worker`` and ``objects``), its result
        replaced by the ids it ``entered``, in the feed as entered."""
        worker = self.worker
        hashes = [[x for key, value in {**f, "worker": worker, "objects": self.details_key(qid)}.items()
                   for x in (key, str(value))] for qid, f in zip(changes.qids, fields)]
        return self._payload(changes, fields=hashes, replace=True)

    def details_payload(self, tag: int, details: Details) -> WritePayload:
        """A payload writing only ``details`` (:attr:`BatchChanges.details`: a resumed service's
        workers, whose queries the new plan may have moved, each write the objects they hold)."""
        return self._payload(BatchChanges([], [], [], [], [], [], details=details), log=False)

    def write_batch(self, tag: int, changes: BatchChanges) -> float:
        """Write one batch's result changes (module docstring); returns the server's seconds
        running the script."""
        return self.apply(tag, self._payload(changes))

    def write_repairs(self, tag: int, changes: BatchChanges) -> float:
        """Write result changes without touching any worker's object details (recovery's
        repairs: the workers write their details when they resume)."""
        return self.apply(tag, self._payload(replace(changes, details={})))

    def delete_query(self, tag: int, qid: str, version: int = 0, members: Sequence[str] = (),
                     details: Details | None = None) -> None:
        """Delete a query's keys; its feed line (at ``version``) lets go of its ``members`` (its
        result as this worker holds it, nearest first: what this worker wrote); ``details`` as
        in :meth:`write_queries`."""
        self.apply(tag, self._payload(BatchChanges([], [], [], [], [], [], version=version, details=details),
                                      delete=qid, released=members))

    def read_details(self, queries: Sequence[tuple[str, Sequence[str]]]) -> dict[str, ObjectInfo]:
        """The details of the objects in these results, from this worker's details hashes
        (``queries``: ``(qid, members)``); an object whose details are missing or unreadable is
        left out.

        Raises
        ------
        StoreUnavailableError
            Redis unreachable after every retry.
        """
        by_key: dict[str, set[str]] = {}
        for qid, members in queries:
            by_key.setdefault(self.details_key(qid), set()).update(members)
        out: dict[str, ObjectInfo] = {}
        for key, oids in by_key.items():
            ids = sorted(oids)
            for s in range(0, len(ids), 10_000):
                part = ids[s:s + 10_000]
                values = with_retries(lambda: self.client.hmget(key, part), "reading object details", self.url)
                for oid, value in zip(part, values):
                    if value is None:
                        continue
                    try:
                        out[oid] = ObjectInfo.from_text(value.decode() if isinstance(value, bytes) else value)
                    except ValueError:
                        continue
        return out

    def _no_results(self, payload: WritePayload) -> WritePayload:
        """``payload`` without its result sections (the holders were counted from them)."""
        return {**payload, "q": [], "ne": [], "e": [], "nl": [], "l": []}

    def adopt_queries(self, tag: int, queries: Sequence[tuple[str, Sequence[str]]],
                      objects: Mapping[str, ObjectInfo], note: Mapping[str, str] | None = None,
                      details: Details | None = None) -> None:
        """Take over queries another worker wrote (re-balancing, :mod:`knnmon.workers.handover`):
        ``queries``: ``(qid, members of its result)``. Their results and the feed do not change;
        their hashes' ``worker`` and ``objects`` fields name this worker and its details hash,
        which gets the details (``objects``) of members no result of this worker held there;
        ``note``: more fields for every query hash; ``details`` as in :meth:`write_queries`."""
        qids = [q for q, _ in queries]
        members = [[o for o in m if o in objects] for _, m in queries]  # (details missing: not held)
        c = BatchChanges(qids, [len(m) for m in members], [o for m in members for o in m],
                         [0.0] * sum(len(m) for m in members), [0] * len(qids), [], objects, details=details)
        extra = [x for key, value in (note or {}).items() for x in (str(key), str(value))]
        fields = [["worker", str(self.worker), "objects", self.details_key(q), *extra] for q in qids]
        payload = self._no_results(self._payload(c, fields=fields, log=False))
        self.apply(tag, {**payload, "sa": []})

    def release_queries(self, tag: int, queries: Sequence[tuple[str, Sequence[str]]],
                        details: Details | None = None) -> None:
        """Let go of queries handed to another worker (``(qid, members)``): their members no
        other result of this worker holds leave its details hashes; ``details`` as in
        :meth:`write_queries`."""
        c = BatchChanges([q for q, _ in queries], [0] * len(queries), [], [], [len(m) for _, m in queries],
                         [o for _, m in queries for o in m], details=details)
        self.apply(tag, self._no_results(self._payload(c, log=False)))

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
