"""Reading results from Redis: the one reader of ``knn:query:{qid}``, ``knn:result:{qid}`` and
the details hashes, for every part of knnmon that reads them (the client, ``knnmon results``
and ``explain``, the dashboard, a worker's revival, recovery, the oracle checks).

What a worker's writer stores (``docs/concepts.md``, "Redis layout"; :mod:`knnmon.workers.result_writer`):
the query hash (``lon``, ``lat``, ``keywords``, ``k``, ``worker``, ``objects``: the key of the
details hash of its result's objects), the result as a sorted set (object id -> distance in
meters, nearest first, ties by id), and each object's details (:class:`~knnmon.batch.ObjectInfo`
text) in the details hash. Many queries are read in pipelined chunks of a bounded size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from knnmon.connection import with_retries
from knnmon.keys import Keys

__all__ = ["CHUNK", "Neighbour", "ResultReader", "StoredLists", "StoredQuery", "StoredResult"]

#: Queries read per pipeline by :meth:`ResultReader.many`.
CHUNK = 10_000

#: Each query's parameters and result of a chunk in one script call (KEYS: query hash, result,
#: query hash, result, ...; ARGV: the fields, :data:`_QUERY_FIELDS`): one reply per chunk, parsed
#: in C by hiredis, instead of two replies per query, each parsed and converted in Python
#: (:meth:`ResultReader.lists`).
_QUERY_FIELDS = ("lon", "lat", "keywords", "k")
_LISTS_SCRIPT = """
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(ARGV))
  out[#out + 1] = redis.call('ZRANGE', KEYS[i + 1], 0, -1, 'WITHSCORES')
end
return out
"""

_RESULTS_SCRIPT = """
local out = {}
for i = 1, #KEYS do out[i] = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES') end
return out
"""


@dataclass(frozen=True)
class StoredLists:
    """Queries as their hashes hold them, with their results, in columns
    (:meth:`ResultReader.lists`).

    Attributes
    ----------
    queries : QueryColumns
        The ``m`` queries found, in the order asked (``knnmon.query.QueryColumns``).
    counts : ``(m,)`` int64
        Each result's length.
    members : list of str
        The results' object ids, query by query, nearest first (``sum(counts)``).
    dist : ``(sum(counts),)`` float64
        Their distances, meters.
    absent : list of str
        Ids asked for that have no query hash.
    """

    queries: Any
    counts: Any
    members: list[str]
    dist: Any
    absent: list[str]

    @classmethod
    def concat(cls, parts: Sequence[StoredLists]) -> StoredLists:
        """The lists of ``parts`` (read chunk by chunk) one after the other."""
        import numpy as np

        from knnmon.query import QueryColumns

        if len(parts) == 1:
            return parts[0]
        qs = [p.queries for p in parts]
        queries = QueryColumns([i for q in qs for i in q.ids], np.concatenate([q.lon for q in qs]),
                               np.concatenate([q.lat for q in qs]), [w for q in qs for w in q.keywords],
                               np.concatenate([q.k for q in qs]))
        return cls(queries, np.concatenate([p.counts for p in parts]), [m for p in parts for m in p.members],
                   np.concatenate([p.dist for p in parts]), [a for p in parts for a in p.absent])

    def results(self) -> list[list[tuple[str, float]]]:
        """Each result as a list of ``(object id, distance m)``."""
        out, at = [], 0
        for n in self.counts.tolist():
            out.append(list(zip(self.members[at:at + n], self.dist[at:at + n].tolist())))
            at += n
        return out


def _number(text: str | None, kind: type) -> Any:
    try:
        return kind(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class StoredQuery:
    """A query hash, typed; ``None`` (or ``[]``) where a field is missing or malformed.

    Attributes
    ----------
    id : str
    lon, lat : float or None
        Degrees.
    keywords : list of str
    k, worker : int or None
    objects : str or None
        The key of the details hash of its result's objects (only ever one of this namespace).
    fields : dict of str to str
        The hash as stored.
    """

    id: str
    lon: float | None
    lat: float | None
    keywords: list[str]
    k: int | None
    worker: int | None
    objects: str | None
    fields: dict[str, str]

    @classmethod
    def of(cls, qid: str, h: dict[str, str], keys: Keys) -> StoredQuery:
        """Type the hash ``h`` of query ``qid``."""
        where = h.get("objects", "")
        if not where.startswith(keys.objects("")):  # no `objects` field before 2026-11-23, or a stranger's
            where = keys.objects(h["worker"]) if h.get("worker") else None
        return cls(qid, _number(h.get("lon"), float), _number(h.get("lat"), float), h.get("keywords", "").split(),
                   _number(h.get("k"), int), _number(h.get("worker"), int), where, h)

    def as_dict(self) -> dict[str, Any]:
        """``{"id", "lon", "lat", "keywords", "k", "worker"}``."""
        return {"id": self.id, "lon": self.lon, "lat": self.lat, "keywords": self.keywords, "k": self.k,
                "worker": self.worker}


@dataclass(frozen=True)
class Neighbour:
    """One object of a result: its id and distance (meters), and where its details were found
    (else ``None``), its point (degrees), time (epoch ms) and keywords."""

    id: str
    distance_m: float
    lon: float | None = None
    lat: float | None = None
    t: int | None = None
    keywords: list[str] | None = None

    @classmethod
    def of(cls, oid: str, distance: float, details: str | None) -> Neighbour:
        from knnmon.batch import ObjectInfo  # numpy: not for the light client, which reads no details

        try:
            o = ObjectInfo.from_text(details) if details else None
        except ValueError:
            o = None
        if o is None:
            return cls(oid, float(distance))
        return cls(oid, float(distance), o.lon, o.lat, o.t, list(o.keywords))


@dataclass(frozen=True)
class StoredResult:
    """A query and its current kNN, nearest first."""

    query: StoredQuery
    knn: list[Neighbour]

    @property
    def radius_m(self) -> float | None:
        """The kNN radius ``r_q`` (the k-th distance, meters); ``None`` while fewer than ``k``
        objects match."""
        k = self.query.k
        return self.knn[-1].distance_m if k and len(self.knn) >= k else None


class ResultReader:
    """Reads queries and results of one namespace (module docstring).

    Parameters
    ----------
    client
        A redis-py client (or cluster client) with string replies.
    keys
        The namespace's keys.
    url
        If given, every read is retried as :func:`~knnmon.connection.with_retries` does
        (raising ``StoreUnavailableError`` after the last try).
    chunk
        Queries per pipeline in :meth:`many`.
    """

    def __init__(self, client: Any, keys: Keys, *, url: str | None = None, chunk: int = CHUNK) -> None:
        self.client = client
        self.keys = keys
        self.url = url
        self.chunk = max(1, int(chunk))

    def _do(self, read, what: str):
        return with_retries(read, what, self.url) if self.url is not None else read()

    def query_hash(self, qid: str) -> dict[str, str]:
        """The query hash as stored (empty if no such query)."""
        return self._do(lambda: self.client.hgetall(self.keys.query(qid)), f"reading query {qid}")

    def result(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` nearest first (empty if
        no such query or no match yet)."""
        got = self._do(lambda: self.client.zrange(self.keys.result(qid), 0, -1, withscores=True),
                       f"reading the result of {qid}")
        return [(o, float(d)) for o, d in got]

    def last(self, qid: str) -> tuple[str, float] | None:
        """The farthest object of ``qid``'s result and its distance (m), ``None`` if empty."""
        got = self._do(lambda: self.client.zrange(self.keys.result(qid), -1, -1, withscores=True),
                       f"reading the result of {qid}")
        return (got[0][0], float(got[0][1])) if got else None

    def read(self, qid: str) -> StoredResult | None:
        """Query ``qid`` with its kNN and each neighbour's details (``None``: not registered)."""

        def read() -> StoredResult | None:
            h = self.client.hgetall(self.keys.query(qid))
            if not h:
                return None
            query = StoredQuery.of(qid, h, self.keys)
            knn = self.client.zrange(self.keys.result(qid), 0, -1, withscores=True)
            details = self.client.hmget(query.objects, [o for o, _ in knn]) if knn and query.objects else []
            return StoredResult(query, [Neighbour.of(o, d, details[j] if j < len(details) else None)
                                        for j, (o, d) in enumerate(knn)])

        return self._do(read, f"reading the result of {qid}")

    def lists(self, qids: Sequence[str]) -> StoredLists:
        """The queries ``qids`` (their parameters) with their results, in columns: a chunk of
        :attr:`chunk` queries per script call on one Redis (a worker's revival reads tens of
        thousands), :meth:`many` on a Redis Cluster (a chunk's keys are in many slots). An id
        whose hash holds none of ``lon``, ``lat``, ``keywords``, ``k`` is absent.

        Raises
        ------
        ValueError
            A query hash with some of those fields missing or unreadable.
        StoreUnavailableError
            Redis unreachable (with ``url``).
        """
        import numpy as np

        from knnmon.query import QueryColumns

        ids, fields, counts, members, dist, absent = [], [], [], [], [], []
        for qid, got, m, d in self._query_fields(qids):
            if all(x is None for x in got):
                absent.append(qid)
                continue
            ids.append(qid)
            fields.append(got)
            counts.append(len(m))
            members += m
            dist += d
        lon, lat, words, k = zip(*fields) if fields else ((), (), (), ())
        try:
            queries = QueryColumns(ids, np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64),
                                   [tuple(w.split()) for w in words], np.asarray(k, dtype=np.int64))
            if np.isnan(queries.lon).any() or np.isnan(queries.lat).any():
                raise ValueError("lon or lat missing")
        except (AttributeError, TypeError, ValueError) as ex:
            raise ValueError(f"a query hash without readable lon, lat, keywords and k ({ex})") from None
        return StoredLists(queries, np.asarray(counts, dtype=np.int64), members, np.asarray(dist, dtype=np.float64),
                           absent)

    def result_columns(self, qids: Sequence[str]) -> tuple[Any, list[str], Any]:
        """The results of ``qids`` in columns, aligned with ``qids`` (a missing result is empty):
        ``(counts (m,) int64, members (sum(counts)) str nearest first, dist (sum(counts),)
        float64 meters)``; one script call per :attr:`chunk` queries on one Redis, :meth:`many`
        on a Redis Cluster.

        Raises
        ------
        StoreUnavailableError
            Redis unreachable (with ``url``).
        """
        import numpy as np
        from redis.cluster import RedisCluster

        counts, members, dist = [], [], []
        if isinstance(self.client, RedisCluster):
            for _, _, r in self.many(qids):
                counts.append(len(r))
                members += [o for o, _ in r]
                dist += [d for _, d in r]
        else:
            script = self.client.register_script(_RESULTS_SCRIPT)
            for s in range(0, len(qids), self.chunk):
                names = [self.keys.result(qid) for qid in qids[s:s + self.chunk]]
                for r in self._do(lambda names=names: script(keys=names), f"reading {len(names)} results"):
                    counts.append(len(r) // 2)
                    members += r[0::2]
                    dist += r[1::2]
        return np.asarray(counts, dtype=np.int64), members, np.asarray(dist, dtype=np.float64)

    def _query_fields(self, qids: Sequence[str]) -> Iterator[tuple[str, list, list[str], list]]:
        """For each of ``qids``: its hash's ``lon``, ``lat``, ``keywords``, ``k`` (``None`` where
        missing), its result's members and their distances (:meth:`lists`)."""
        from redis.cluster import RedisCluster

        if isinstance(self.client, RedisCluster):
            for qid, h, r in self.many(qids, hashes=True):
                yield qid, [h.get(f) for f in _QUERY_FIELDS], [o for o, _ in r], [d for _, d in r]
            return
        script = self.client.register_script(_LISTS_SCRIPT)
        for s in range(0, len(qids), self.chunk):
            part = qids[s:s + self.chunk]
            names = [key for qid in part for key in (self.keys.query(qid), self.keys.result(qid))]
            got = self._do(lambda names=names: script(keys=names, args=_QUERY_FIELDS),
                           f"reading {len(part)} queries")
            for qid, h, r in zip(part, got[0::2], got[1::2]):
                yield qid, h, r[0::2], r[1::2]

    def many(self, qids: Sequence[str], *, hashes: bool = False,
             results: bool = True) -> Iterator[tuple[str, dict[str, str] | None, list[tuple[str, float]] | None]]:
        """``(qid, query hash or None, result or None)`` for each of ``qids`` in order, read in
        pipelines of :attr:`chunk` queries; ``hashes``/``results``: which of the two to read."""
        for s in range(0, len(qids), self.chunk):
            part = qids[s:s + self.chunk]

            def read(part=part) -> list:
                pipe = self.client.pipeline(transaction=False)
                for qid in part:
                    if hashes:
                        pipe.hgetall(self.keys.query(qid))
                    if results:
                        pipe.zrange(self.keys.result(qid), 0, -1, withscores=True)
                return pipe.execute()

            got = self._do(read, f"reading {len(part)} queries")
            step = int(hashes) + int(results)
            for i, qid in enumerate(part):
                h = got[step * i] if hashes else None
                r = got[step * i + int(hashes)] if results else None
                yield qid, h, ([(o, float(d)) for o, d in r] if r is not None else None)
