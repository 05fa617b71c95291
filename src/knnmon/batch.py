"""What travels between the coordinator, the workers and the result writer, typed.

- :class:`ObjectBatch`: one batch of objects, from dispatch to every worker it is routed to;
- :class:`BatchChanges`: one batch's result changes, from a worker's merge (or recovery) to the
  :class:`~knnmon.workers.result_writer.ResultWriter`;
- with a window, :class:`~knnmon.refills.DueLists` and :class:`~knnmon.refills.Refills`
  (:mod:`knnmon.refills`);
- :class:`QueryHandover`: queries with their kNN, moving between workers (re-balancing);
- what a worker measured and reports (:class:`~knnmon.reports.WorkerReport`, ...) is in
  :mod:`knnmon.reports`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from knnmon.arrays import runs
from knnmon.arrow_ipc import ipc_of_table, table_of_ipc

__all__ = ["BatchChanges", "KnnColumns", "ObjectBatch", "ObjectColumns", "ObjectInfo", "QueryHandover"]


@dataclass(frozen=True)
class ObjectInfo:
    """An object's details (``knn:objects:{worker}``): ``lon``, ``lat`` degrees, ``t`` epoch ms, keywords."""

    lon: float
    lat: float
    t: int
    keywords: Sequence[str]

    def to_text(self) -> str:
        """The value in ``knn:objects:{worker}``: ``lon lat t keywords`` (degrees, epoch ms, the
        keywords space separated; keywords hold no whitespace)."""
        return " ".join([repr(float(self.lon)), repr(float(self.lat)), str(int(self.t)), *self.keywords])

    @classmethod
    def from_text(cls, value: str) -> ObjectInfo:
        """The details :meth:`to_text` wrote.

        Raises
        ------
        ValueError
            Not such a text.
        """
        parts = value.split(" ")
        if len(parts) < 3:
            raise ValueError(f"not object details: {value[:80]!r}")
        return cls(float(parts[0]), float(parts[1]), int(parts[2]), parts[3:])


class ObjectColumns(Mapping[str, ObjectInfo]):
    """Objects' details by id, kept in columns; each :class:`ObjectInfo` is made when it is
    looked up. A batch's write needs the details of the objects no result held before, a few
    hundred of its objects, and a load the details of every object in its queries' initial
    results: a mapping of :class:`ObjectInfo` built ahead would make one per object, and cost
    more to send to a Ray worker than the columns. :meth:`texts` and :meth:`times` read many in
    bulk (from an Arrow table, :meth:`of_table`, with Arrow's kernels).

    Parameters
    ----------
    ids
        ``n`` object ids (distinct); ``None`` with ``table`` (its ``id`` column).
    lon, lat, t
        ``(n,)`` float64 degrees, float64 degrees, int64 epoch ms.
    keywords
        ``n`` keyword lists.
    """

    def __init__(self, ids: Sequence[str] | None, lon: Any, lat: Any, t: Any,
                 keywords: Sequence[Sequence[str]] | None, table: Any = None) -> None:
        self._ids, self._keywords, self._table = ids, keywords, table
        self._lon, self._lat = np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)
        self._t = np.asarray(t, dtype=np.int64)
        self._index: dict[str, int] | None = None

    @classmethod
    def of_table(cls, table: Any) -> ObjectColumns:
        """From a ``pyarrow.Table`` with ``id``, ``lon``, ``lat``, ``t`` and ``keywords``
        (:class:`ObjectBatch`'s columns), kept as it is: taken and sent as the table (Arrow's
        buffers), its ids made Python strings when first read."""
        table = table.select(["id", "lon", "lat", "t", "keywords"])
        return cls(None, table.column("lon").to_numpy(), table.column("lat").to_numpy(), table.column("t").to_numpy(),
                   None, table)

    @classmethod
    def of_infos(cls, objects: Mapping[str, ObjectInfo]) -> ObjectColumns:
        """From a mapping of id -> :class:`ObjectInfo`, into an Arrow table (what a hand-over
        sends: no Python object per object on the way)."""
        import pyarrow as pa

        infos = list(objects.values())
        return cls.of_table(pa.table({
            "id": pa.array(list(objects), type=pa.string()),
            "lon": pa.array([o.lon for o in infos], type=pa.float64()),
            "lat": pa.array([o.lat for o in infos], type=pa.float64()),
            "t": pa.array([o.t for o in infos], type=pa.int64()),
            "keywords": pa.array([list(o.keywords) for o in infos], type=pa.list_(pa.string()))}))

    @classmethod
    def of_texts(cls, ids: Sequence[str], texts: Sequence[str]) -> ObjectColumns:
        """From the texts :meth:`ObjectInfo.to_text` wrote (a details hash's values), parsed
        with Arrow's kernels into a table (a revival reads tens of thousands: no Python object
        per object).

        Raises
        ------
        ValueError
            A text that is not such details.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        parts = pc.split_pattern(pa.array(list(texts), type=pa.string()), " ")
        if len(parts) and pc.min(pc.list_value_length(parts)).as_py() < 3:
            raise ValueError("not object details: fewer than 3 fields")
        try:
            columns = {"lon": pc.cast(pc.list_element(parts, 0), pa.float64()),
                       "lat": pc.cast(pc.list_element(parts, 1), pa.float64()),
                       "t": pc.cast(pc.list_element(parts, 2), pa.int64())}
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as ex:
            raise ValueError(f"not object details ({ex})") from None
        keywords = pc.list_slice(parts, 3)
        keywords = pc.if_else(pc.is_null(keywords), pa.scalar([], pa.list_(pa.string())), keywords)
        return cls.of_table(pa.table({"id": pa.array(list(ids), type=pa.string()), **columns,
                                      "keywords": keywords.cast(pa.list_(pa.string()))}))

    def subset(self, oids: Sequence[str]) -> ObjectColumns:
        """The objects of ``oids`` that are here (each once), in columns."""
        rows = np.unique(self._rows(list(oids)))
        return self.take(rows[rows >= 0])

    def take(self, rows: Any) -> ObjectColumns:
        """The objects at ``rows`` (``(r,)`` int64 positions here, each once), in that order."""
        if self._table is not None:
            import pyarrow as pa

            return ObjectColumns.of_table(self._table.take(pa.array(np.asarray(rows, dtype=np.int64))))
        sel = np.asarray(rows, dtype=np.int64).tolist()
        return ObjectColumns([self._ids[j] for j in sel], self._lon[sel], self._lat[sel], self._t[sel],
                             [self._keywords[j] for j in sel])

    @property
    def _at(self) -> dict[str, int]:
        """Id -> position, made on first use (not sent with the columns)."""
        if self._index is None:
            self._index = {oid: j for j, oid in enumerate(self.ids)}
        return self._index

    def __reduce__(self):
        """Sent as the table alone where there is one (no Python string per object)."""
        if self._table is not None:
            return ObjectColumns.of_table, (self._table,)
        return ObjectColumns, (self._ids, self._lon, self._lat, self._t, self._keywords)

    def _words(self, j: int) -> list[str]:
        if self._keywords is not None:
            return self._keywords[j]
        return self._table.column("keywords")[j].as_py()

    def __getitem__(self, oid: str) -> ObjectInfo:
        j = self._at[oid]
        return ObjectInfo(float(self._lon[j]), float(self._lat[j]), int(self._t[j]), self._words(j))

    def __contains__(self, oid: object) -> bool:
        return oid in self._at

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self._t)

    @property
    def ids(self) -> Sequence[str]:
        """The ``n`` ids, by row."""
        if self._ids is None:
            self._ids = self._table.column("id").to_pylist()
        return self._ids

    @property
    def t(self) -> np.ndarray:
        """``(n,)`` int64: the times (epoch ms), by row."""
        return self._t

    def texts(self, oids: Sequence[str] | None = None) -> list[str | None]:
        """:meth:`ObjectInfo.to_text` of ``oids`` in bulk (the same values; from an Arrow table
        the numbers in Arrow's shortest round-trip form, e.g. ``-71`` for ``-71.0``); ``None``
        for an id not here. ``oids=None``: every object's, by row."""
        if oids is None:
            if self._table is not None:
                return _arrow_texts(self._table)
            oids = self.ids
        if not len(self):
            return [None] * len(oids)
        rows = self._rows(oids)
        at, js = np.maximum(rows, 0), rows.tolist()
        if self._table is not None:
            out = _arrow_texts(self._table.take(at))
            return [x if j >= 0 else None for x, j in zip(out, js)]
        lon, lat, t = self._lon[at].tolist(), self._lat[at].tolist(), self._t[at].tolist()
        kw = self._keywords
        return [" ".join([repr(x), repr(y), str(z), *kw[j]]) if j >= 0 else None
                for x, y, z, j in zip(lon, lat, t, js)]

    def times(self, oids: Sequence[str], default: int) -> np.ndarray:
        """``(len(oids),)`` int64: the objects' times (epoch ms), ``default`` for an id not here."""
        if not len(self):
            return np.full(len(oids), default, dtype=np.int64)
        rows = self._rows(oids)
        return np.where(rows >= 0, self._t[np.maximum(rows, 0)], default).astype(np.int64)

    def _rows(self, oids: Sequence[str]) -> np.ndarray:
        """``(len(oids),)`` int64: each id's row here, ``-1`` for an id not here."""
        get = self._at.get
        return np.fromiter((get(o, -1) for o in oids), dtype=np.int64, count=len(oids))


def _arrow_texts(table: Any) -> list[str]:
    """:meth:`ObjectInfo.to_text` of every row of a table with ``lon``, ``lat``, ``t`` and
    ``keywords``, with Arrow's kernels (no Python per row but the final list)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kw = table.column("keywords")
    words = pc.if_else(pc.equal(pc.list_value_length(kw), 0), pa.scalar(None, pa.string()), pc.binary_join(kw, " "))
    return pc.binary_join_element_wise(*(pc.cast(table.column(c), pa.string()) for c in ("lon", "lat", "t")), words,
                                       " ", null_handling="skip").to_pylist()


class KnnColumns(Sequence[list[tuple[str, float]]]):
    """Queries' kNN lists in three columns: query ``i``'s list is the next ``counts[i]`` entries
    of ``ids`` and ``dist`` (meters), nearest first. A sequence of ``[(object id, distance m),
    ...]`` lists where one is needed (each made when it is read); a worker's load reads the
    columns themselves (:func:`knnmon.workers.registration.kept_entries`), and they cost less to
    send to a Ray worker than lists of tuples.

    Parameters
    ----------
    counts
        ``(m,)`` int64.
    ids
        ``sum(counts)`` object ids (kept as an object array).
    dist
        ``(sum(counts),)`` float64 meters.
    rows
        ``(sum(counts),)`` int64 or ``None``: where the lists come with their objects' details
        (:meth:`ObjectColumns.take`), each entry's row there.
    """

    def __init__(self, counts: Any, ids: Sequence[str], dist: Any, rows: Any = None) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.ids = np.asarray(ids, dtype=object).reshape(-1)
        self.dist = np.asarray(dist, dtype=np.float64)
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self._ends = np.cumsum(self.counts)

    def take(self, rows: Sequence[int]) -> KnnColumns:
        """The lists of ``rows`` (query indices), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        n = self.counts[rows]
        at = runs(self._ends[rows] - n, n)
        return KnnColumns(n, self.ids[at], self.dist[at], None if self.rows is None else self.rows[at])

    def kth(self, k: Any) -> np.ndarray:
        """``(m,)`` float64: each list's ``k[i]``-th distance (meters), ``inf`` where it holds
        fewer than ``k[i]`` entries (``k``: ``(m,)`` ints ``>= 1``)."""
        k = np.asarray(k, dtype=np.int64)
        out = np.full(len(self.counts), np.inf)
        full = self.counts >= k
        out[full] = self.dist[(self._ends - self.counts + k - 1)[full]]
        return out

    def firsts(self, n: Any) -> list[list[str]]:
        """The ids of each list's first ``n[i]`` entries (``(m,)`` ints; at most its count)."""
        n = np.minimum(np.asarray(n, dtype=np.int64), self.counts)
        start = (self._ends - self.counts).tolist()
        return [list(self.ids[a:a + c]) for a, c in zip(start, n.tolist())]

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        end = int(self._ends[i])
        start = end - int(self.counts[i])
        return list(zip(self.ids[start:end], self.dist[start:end].tolist()))


@dataclass(frozen=True)
class ObjectBatch:
    """One batch of objects as every worker receives it (serialised once, into Ray's object store).

    Attributes
    ----------
    number : int
        The batch number, ``>= 0`` (the idempotency tag of its Redis writes).
    table : pyarrow.Table
        ``n`` objects: ``id`` string, ``lon``, ``lat`` float64 degrees, ``t`` int64 epoch ms,
        ``keywords`` list<string> (normalised); ids new to the run.
    pair_obj, pair_code : numpy.ndarray
        ``(p,)`` int64: the batch's (object row, keyword code) pairs, encoded with the routing
        table's vocabulary, which the workers share.
    masks : numpy.ndarray or None
        ``(n,)`` uint64: each object's workers as a bitmask (the routing table's); a worker
        called without its rows takes the rows with its bit (``None``: rows are always given).
    """

    number: int
    table: Any
    pair_obj: Any
    pair_code: Any
    masks: Any = None

    def __reduce__(self):
        """Pickled with the table as one Arrow IPC stream (half the CPU of a ``ray.put``)."""
        return _object_batch, (self.number, ipc_of_table(self.table), self.pair_obj, self.pair_code, self.masks)

    def rows_of(self, worker: int) -> np.ndarray:
        """``(m,)`` int64: the rows whose bitmask has ``worker``'s bit (:attr:`masks`).

        Raises
        ------
        ValueError
            The batch has no masks.
        """
        if self.masks is None:
            raise ValueError(f"batch {self.number} carries no worker bitmasks: its rows must be given")
        return np.flatnonzero((self.masks >> np.uint64(worker)) & np.uint64(1))


def _object_batch(number: int, table: Any, pair_obj: Any, pair_code: Any, masks: Any) -> ObjectBatch:
    """An :class:`ObjectBatch` unpickled (its table read back from IPC bytes)."""
    return ObjectBatch(number, table_of_ipc(table), pair_obj, pair_code, masks)


@dataclass(frozen=True)
class BatchChanges:
    """One batch's result changes, flattened per changed query (one script call writes them).

    Query ``qids[j]`` gained the next ``n_entered[j]`` ids of ``entered`` (at ``distances``,
    meters) and lost the next ``n_left[j]`` ids of ``left``; ``objects`` holds the details of
    every object in ``entered``. ``version`` is the change feed's version of all of them: the
    number of stream batches applied once they are (a stream batch numbered ``b`` writes
    ``b + 1``; a registration between batches, the number applied so far). ``details``: what
    the write does to the worker's details hashes, counted by the worker
    (:mod:`knnmon.workers.holders`): details hash key -> (``HSET`` arguments ``id, text, ...``,
    ``HDEL`` ids); ``None``: the writer counts them itself, by id, from ``objects``.
    """

    qids: Sequence[str]
    n_entered: Sequence[int]
    entered: Sequence[str]
    distances: Sequence[float]
    n_left: Sequence[int]
    left: Sequence[str]
    objects: Mapping[str, ObjectInfo] = field(default_factory=dict)
    version: int = 0
    details: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None

    def __len__(self) -> int:
        return len(self.qids)

    @classmethod
    def from_diffs(cls, diffs: Sequence[tuple[str, Sequence[tuple[str, float]], Sequence[str]]],
                   objects: Mapping[str, ObjectInfo], version: int = 0) -> BatchChanges:
        """From ``(qid, [(entered id, distance m), ...], [left id, ...])`` per changed query."""
        return cls([d[0] for d in diffs], [len(d[1]) for d in diffs],
                   [o for d in diffs for o, _ in d[1]], [float(x) for d in diffs for _, x in d[1]],
                   [len(d[2]) for d in diffs], [o for d in diffs for o in d[2]],
                   {o: objects[o] for d in diffs for o, _ in d[1]}, version)

    def feed_text(self) -> str:
        """The changes as the change feed's ``changes`` field (:mod:`knnmon.feed`)."""
        from knnmon.feed import feed_text

        return feed_text(self.qids, self.n_entered, self.entered, self.n_left, self.left)


@dataclass(frozen=True)
class QueryHandover:
    """Queries moving from one worker to another at a batch boundary (re-balancing), in columns.

    Attributes
    ----------
    queries : QueryColumns
        The ``m`` queries (``knnmon.query.QueryColumns``).
    topk : KnnColumns
        Each query's kept places as its worker held them, nearest first: its kNN, and with a
        reserve the ``k + reserve`` nearest; fewer while it has fewer matches. The result as
        written to Redis is each list's first ``k`` (:attr:`members`).
    objects : ObjectColumns
        Details of the objects in ``topk`` that the worker knew (an object missing here is not
        written to the target's details hash).
    loads : ``(m,)`` float64
        Each query's recent measured load (microseconds; :mod:`knnmon.workers.query_load`).
    radii : ``(m,)`` float64
        Each query's kNN radius ``r_q`` as its worker held it (meters): every matching live
        object within it is in ``topk``; ``inf`` when ``topk`` holds every matching object. With
        a window a list can hold fewer than ``k + reserve`` places (expired) and still have a
        finite radius: the radius cannot be told from ``topk`` alone.
    vocabulary : mapping str -> int
        The codes of the queries' keywords, as the coordinator encodes batches (the source knew
        them; a target handed the export directly, without the coordinator, learns them here).
    seconds : float
        How long the source took to export them.
    """

    queries: Any
    topk: KnnColumns
    objects: ObjectColumns
    loads: Any
    radii: Any
    vocabulary: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.topk)

    @property
    def members(self) -> list[list[str]]:
        """Each query's result as written: the ids of its first ``k`` kept places."""
        return self.topk.firsts(np.asarray(self.queries.k, dtype=np.int64))

    def split(self, parts: Sequence[Sequence[str]]) -> list[QueryHandover]:
        """One handover per part of query ids, in order; an id not handed over here is skipped
        (each part's ``seconds``: its share of this export's, by queries)."""
        at = {q: i for i, q in enumerate(self.queries.ids)}
        out = []
        for part in parts:
            h = self.take([at[q] for q in part if q in at])
            out.append(replace(h, seconds=self.seconds * len(h) / max(len(self), 1)))
        return out

    def take(self, rows: Sequence[int]) -> QueryHandover:
        """The queries ``rows`` (indices, in that order) with their places and objects."""
        topk = self.topk.take(rows)
        rows = np.asarray(rows, dtype=np.int64)
        return QueryHandover(self.queries.take(rows), topk, self.objects.subset(topk.ids), np.asarray(self.loads)[rows],
                             np.asarray(self.radii, dtype=np.float64)[rows], self.vocabulary, self.seconds)
