"""The worker: owns a share of the queries and keeps their kNN exact as object batches arrive.

A plain class (unit-testable without a cluster); :mod:`knnmon.workers.actor` wraps it as a Ray
actor at the edge. Per batch (``SPEC.md``, "The worker"; Tsuruoka et al. 2019, §4.4):

1. candidates: (object, query) pairs whose query region holds the object and shares a keyword,
   from :class:`~knnmon.workers.query_index.QueryIndex` (vectorised, no loop over objects);
2. exact haversine check against ``r_q`` (queries with fewer than ``k`` results pass always);
3. top-k update, ordered by ``(distance m, object id)``; ``r_q`` shrinks and the query is
   re-indexed with its smaller region (:meth:`QueryIndex.refresh`, into a small delta run, no re-sort);
4. every changed result, the objects now in results, and one ``changes`` entry per changed
   query (:class:`~knnmon.batch.BatchChanges`) written in one atomic, exactly-once script call
   (:class:`~knnmon.workers.result_writer.ResultWriter`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from knnmon.arrays import runs, with_capacity
from knnmon.batch import BatchChanges, ObjectBatch, ObjectInfo, Refills, WorkerReport, WriteFigures
from knnmon.encoding import id_prefix_keys
from knnmon.errors import InvalidArgumentError, InvalidQueryError
from knnmon.geo import chord2_bound, haversine_m, unit_vectors
from knnmon.heap import give_back, resident_bytes
from knnmon.query import QueryColumns
from knnmon.workers import kernels
from knnmon.workers.keyword_lists import KeywordLists
from knnmon.workers.handover import Handover
from knnmon.workers.query_index import QueryIndex
from knnmon.workers.query_load import QueryLoad
from knnmon.workers.result_writer import ResultWriter
from knnmon.workers.rtree_index import RTreeIndex, SearchGroup
from knnmon.workers.write_queue import WriteQueue

__all__ = ["INDEXES", "MAX_RELEASE_GROUPS", "NO_TIME", "KnnWorker", "Merge", "sjf_groups"]

#: The time of an object whose time a worker was not told (it never expires).
NO_TIME = np.iinfo(np.int64).max

#: Query-region index by name: knnmon's keyword-aware grid, the keyword-aware R-tree with
#: BatchSearch (Wang, Zhang, Kitsuregawa), or the single-process reference's keyword lists.
INDEXES = {"grid": QueryIndex, "rtree": RTreeIndex, "keyword-lists": KeywordLists}
#: At most this many parts per batch (:class:`KnnWorker`'s ``release_groups``): each costs a
#: script call.
MAX_RELEASE_GROUPS = 64


#: Compaction (:meth:`KnnWorker.compact`) waits for at least this many places or handles to release.
COMPACT_MIN = 1 << 16


def _pairs_of_rows(batch: ObjectBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (object, keyword code) pairs of a shared batch's rows ``rows`` (``(m,)`` int64), the
    objects renumbered as positions in ``rows``: ``(p,)`` int64 each."""
    remap = np.full(batch.table.num_rows, -1, dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    sel = remap[batch.pair_obj] >= 0
    return remap[batch.pair_obj[sel]], batch.pair_code[sel]


def sjf_groups(obj: np.ndarray, slot: np.ndarray, n: int, size: int) -> Iterator[SearchGroup]:
    """A batch's exact candidate pairs (``(c,)`` int64 ``obj``, ``slot``; ``n`` objects) cut
    into Short-Job-First groups of ``size`` objects: the objects by ascending candidate count
    (ties in batch order), each group with its pairs. An index without BatchSearch releases a
    batch in parts with these (:class:`KnnWorker`'s ``release_groups``)."""
    work = np.bincount(obj, minlength=n).astype(np.int64)
    order = np.argsort(work, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    g = rank[obj] // size
    by = np.argsort(g, kind="stable")
    obj, slot, g = obj[by], slot[by], g[by]
    cut = np.searchsorted(g, np.arange(-(-n // size) + 1))
    for i in range(len(cut) - 1):
        objs = order[i * size:(i + 1) * size]
        yield SearchGroup(objs, work[objs], obj[cut[i]:cut[i + 1]], slot[cut[i]:cut[i + 1]])


def _own(text: str) -> str:
    """A fresh copy of ``text`` for the worker to keep. The ids of queries and objects arrive
    inside a call's arguments, unpickled among millions of short-lived objects (lists, tuples,
    floats); keeping those very strings pins every memory arena of the payload after the call
    (docs/scale.md, "Bytes per query in a worker"), while copies made here sit together."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _mb(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def _warm_up() -> None:
    """Load pyarrow's compute kernels and compile (or load) the worker's numba kernels now: in a
    fresh worker process their first use costs ~0.2-0.6 s, which would otherwise land on the
    first batch's update time."""
    import pyarrow as pa

    kernels.compile_kernels()

    t = pa.table({"id": ["a"], "keywords": [["b"]]})
    t.take(np.array([0])).column("keywords").to_pylist()


@dataclass
class Merge:
    """What merging a batch's pairs changed (:meth:`KnnWorker._update`). Arrays ``(x,)``;
    entered and left entries grouped by slot in slot order.

    ``passed``: pairs within ``r_q``; ``changed``: sorted slots whose kept list gained an entry
    (without a reserve, whose result changed); ``in_result``: sorted slots a new entry entered
    the result (the first ``k``) of; entered ``e_slot``, ``e_obj`` (batch position), ``e_d``
    (meters), ``e_place`` (its place in the flat lists), ``e_h`` (its handle); left ``l_slot``,
    ``l_h``; ``b_slot``, ``b_h``: the changed lists' results before the merge;
    ``entered_obj``: the sorted batch positions of the objects that entered.
    """

    ARRAYS: ClassVar[tuple[str, ...]] = ("changed", "in_result", "e_slot", "e_obj", "e_d", "e_place", "l_slot",
                                          "l_h", "b_slot", "b_h")

    passed: int
    changed: np.ndarray
    in_result: np.ndarray
    e_slot: np.ndarray
    e_obj: np.ndarray
    e_d: np.ndarray
    e_place: np.ndarray
    l_slot: np.ndarray
    l_h: np.ndarray
    b_slot: np.ndarray
    b_h: np.ndarray
    e_h: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    entered_obj: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def before(self) -> tuple[np.ndarray, np.ndarray]:
        return self.b_slot, self.b_h

    def plus(self, other: Merge) -> Merge:
        """Both merges' entries (of disjoint slots), regrouped in slot order."""
        def cat(names: tuple[str, ...], key: str) -> list[np.ndarray]:
            arrays = [np.concatenate([getattr(self, n), getattr(other, n)]) for n in names]
            order = np.argsort(arrays[names.index(key)], kind="stable")
            return [a[order] for a in arrays]

        e = cat(("e_slot", "e_obj", "e_d", "e_place"), "e_slot")
        lv = cat(("l_slot", "l_h"), "l_slot")
        b = cat(("b_slot", "b_h"), "b_slot")
        return Merge(self.passed + other.passed, np.union1d(self.changed, other.changed),
                     np.union1d(self.in_result, other.in_result), *e, *lv, *b)


class KnnWorker(Handover):
    """Exact kNN maintenance for a set of queries.

    Each query's top-k is a run of ``k`` places in two flat arrays, ``top_d`` (float64 meters,
    ``inf`` padded) and ``top_h`` (int64 object handles, ``-1`` padded), starting at
    ``top_ptr[slot]``, nearest first (entries at equal distance in any order), its first
    ``count[slot]`` places filled: memory follows the sum of the queries' ``k``, not the largest
    ``k`` times the queries. A batch merges them with its candidates in one ``lexsort`` (no
    Python loop over queries or objects). Unregistered queries' places, and handles no result
    holds any more, are released by :meth:`compact` once they are half of what is held.
    Handles index ``oids``, the ids of objects that entered a result here. Each query also keeps
    ``reach``: its unit vector and :func:`~knnmon.geo.chord2_bound` of ``r_q`` (``-1`` once
    removed), the cheap pre-test of a candidate.

    Parameters
    ----------
    worker_id
        This worker's number (written to ``knn:query:{qid}`` as ``worker``).
    redis_url
        Where results go; ``None`` keeps results in memory only (tests, dry runs).
    namespace
        Redis key prefix.
    vocabulary
        Keyword -> code map shared with the coordinator, so batches can arrive pre-encoded
        (``pairs`` of :meth:`process_batch`); keywords first seen here get new codes.
    index
        ``"grid"`` (the keyword-aware :class:`QueryIndex`), ``"rtree"`` (the R-tree with BatchSearch,
        :class:`~knnmon.workers.rtree_index.RTreeIndex`) or ``"keyword-lists"`` (the
        single-process reference's :class:`~knnmon.workers.keyword_lists.KeywordLists`).
    overlap_writes
        Write each batch's changes on a background thread (:class:`WriteQueue`) while the next
        batch is computed; the caller then gets the write's figures from :meth:`written`.
        Default: the batch's call returns after its write.
    reserve
        With a window: each query keeps this many neighbours beyond its ``k`` (its result is
        the first ``k``), so that an expiry takes the next one from the reserve instead of a
        refill search (Skype's k-skyband idea, VLDBJ 2017; :meth:`expire`).
    track_load
        Charge each query its measured load per batch (:mod:`knnmon.workers.query_load`), for
        re-balancing; off, a batch pays nothing for it and every load reads 0.
    release_groups
        Release a batch's changes in up to this many parts, objects in Short-Job-First order
        (Wang, Zhang and Kitsuregawa: each object's changes go out as soon as it is done, so
        the cheap ones do not wait for the expensive ones): the R-tree index's BatchSearch
        (:meth:`RTreeIndex.batch_search`) or, with another index, the batch's exact candidates
        grouped by their count. 1 (the default): one write per batch. Not with
        ``overlap_writes``.

    Raises
    ------
    InvalidArgumentError
        An unknown ``index``, a negative ``reserve``, ``release_groups`` outside
        ``1..MAX_RELEASE_GROUPS``.
    """

    def __init__(self, worker_id: int, redis_url: str | None, namespace: str = "knn", *,
                 vocabulary: Mapping[str, int] | None = None, index: str = "grid", overlap_writes: bool = False,
                 reserve: int = 0, track_load: bool = False, release_groups: int = 1) -> None:
        if index not in INDEXES:
            raise InvalidArgumentError(f"Invalid index: {index!r}.\nValid options are: {tuple(INDEXES)}")
        if reserve < 0:
            raise InvalidArgumentError(f"the reserve must be >= 0; got {reserve}")
        if not 1 <= release_groups <= MAX_RELEASE_GROUPS:
            raise InvalidArgumentError(f"release_groups must be in 1..{MAX_RELEASE_GROUPS}; got {release_groups}")
        self.release_groups = int(release_groups)
        self.worker_id, self.reserve = worker_id, int(reserve)
        self.writer = ResultWriter(redis_url, namespace, worker_id) if redis_url else None
        self.queue = WriteQueue(self.writer) if self.writer is not None and overlap_writes else None
        self.qids: list[str] = []
        self.slot_of: dict[str, int] = {}
        self.lon = np.empty(0)
        self.lat = np.empty(0)
        self.k = np.empty(0, dtype=np.int64)
        self.cap = np.empty(0, dtype=np.int64)  # places per query: k + reserve
        self.radius = np.empty(0)
        self.reach = np.empty((0, 4))  # per query: unit vector x, y, z and chord2_bound(r_q); -1 if removed
        self.alive = np.empty(0, dtype=bool)
        self.top_ptr = np.empty(0, dtype=np.int64)  # slot -> its first place in top_d / top_h
        self.top_d = np.empty(0)
        self.top_h = np.empty(0, dtype=np.int64)
        self.count = np.empty(0, dtype=np.int64)
        self._released = 0  # places of unregistered queries, until compact()
        self._live_handles = 0  # handles held after the last compact()
        self.oids: list[str] = []
        self.handle_of: dict[str, int] = {}
        self._oid_key = np.zeros(0, dtype=np.uint64)  # id_prefix_keys of oids[:_keyed], capacity-doubled
        self._keyed = 0
        self._t = np.zeros(0, dtype=np.int64)  # each handle's object time (epoch ms), capacity-doubled
        self._before: tuple[np.ndarray, np.ndarray] | None = None  # (slot, handle) results before an expiry
        self._cutoff = np.iinfo(np.int64).min  # the last expiry's cutoff
        self._refilled: dict[str, ObjectInfo] = {}  # details of the objects a refill brought in
        self._details: dict[str, ObjectInfo] | None = {} if reserve else None  # of every object held
        self.expired = self.refills = 0
        self.keywords: list[str] = []  # per slot, its keywords space separated (keywords hold no space)
        self.kw_ptr = np.zeros(1, dtype=np.int64)  # CSR: query slot -> its keyword codes
        self.kw_code = np.empty(0, dtype=np.int64)
        self.vocab: dict[str, int] = {}
        self._next_code = 0  # a keyword no coordinator code came with gets this one, then it grows
        self._learn(vocabulary)
        self.index = INDEXES[index]()
        self.load = QueryLoad()  # each query's recent measured load (re-balancing reads it)
        self.track_load = track_load
        self._handed: list[tuple[str, list[str]]] = []  # (query, members) exported, not yet released
        self._tag = 0
        self._version = 0  # the change feed version of the batch being processed
        self.refreshed = 0
        _warm_up()

    # -- queries -----------------------------------------------------------------------------
    def _learn(self, vocabulary: Mapping[str, int] | None) -> None:
        """Take the coordinator's codes of some keywords (those of the queries coming here)."""
        if vocabulary:
            self.vocab.update({_own(w): int(c) for w, c in vocabulary.items()})
            self._next_code = max(self._next_code, max(vocabulary.values()) + 1)

    def _codes(self, words: Sequence[str]) -> list[int]:
        out = []
        for w in words:
            c = self.vocab.get(w)
            if c is None:
                c = self.vocab[_own(w)] = self._next_code
                self._next_code += 1
            out.append(c)
        return out

    def _handle(self, oid: str, t: int = NO_TIME) -> int:
        h = self.handle_of.get(oid)
        if h is None:
            oid = _own(oid)
            h = self.handle_of[oid] = len(self.oids)
            self.oids.append(oid)
            self._t = with_capacity(self._t, h + 1)
            self._t[h] = t
        return h

    def _handle_in(self, oid: str, objects: Mapping[str, ObjectInfo]) -> int:
        """:meth:`_handle` of an object whose details ``objects`` may hold (its time, if so)."""
        info = objects.get(oid)
        return self._handle(oid, info.t if info is not None else NO_TIME)

    def _key_handles(self) -> None:
        """Extend the handles' id prefix keys (:func:`~knnmon.encoding.id_prefix_keys`) to new handles."""
        n = len(self.oids)
        if n > self._keyed:
            self._oid_key = with_capacity(self._oid_key, n)
            self._oid_key[self._keyed:n] = id_prefix_keys(self.oids[self._keyed:n])
            self._keyed = n

    def _append(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                objects: Mapping[str, ObjectInfo]) -> range:
        """Add valid queries in bulk (one array concatenation); returns their slots.

        Raises
        ------
        InvalidQueryError
            An id this worker holds already.
        """
        ids, lon, lat, keywords = queries.ids, queries.lon, queries.lat, queries.keywords
        first, n = len(self.qids), len(ids)
        k = np.asarray(queries.k, dtype=np.int64).reshape(n)
        cap = k + self.reserve
        start = np.cumsum(cap) - cap  # each new query's first place, relative
        top_d, top_h = np.full(int(cap.sum()), np.inf), np.full(int(cap.sum()), -1, dtype=np.int64)
        count, radii, codes = np.zeros(n, dtype=np.int64), np.full(n, np.inf), []
        for i, qid in enumerate(ids):
            qid, kk, words = str(qid), int(k[i]), tuple(keywords[i])
            if qid in self.slot_of:
                raise InvalidQueryError(f"worker {self.worker_id}: query {qid!r} is already registered")
            qid = _own(qid)
            self.slot_of[qid] = first + i
            self.qids.append(qid)
            self.keywords.append(" ".join(words))
            row = self._codes(words)
            codes.append(row)
            lst = sorted((float(d), str(o)) for o, d in topk[i])[:kk + self.reserve]
            count[i] = len(lst)
            for j, (d, o) in enumerate(lst):
                top_d[start[i] + j], top_h[start[i] + j] = d, self._handle_in(o, objects)
            if len(lst) == kk + self.reserve:
                radii[i] = lst[-1][0]
        self.kw_ptr = np.concatenate([self.kw_ptr, self.kw_ptr[-1] + np.cumsum([len(c) for c in codes], dtype=np.int64)])
        self.kw_code = np.concatenate([self.kw_code, np.fromiter((c for row in codes for c in row), dtype=np.int64)])
        self.lon = np.concatenate([self.lon, np.asarray(lon, dtype=np.float64)])
        self.lat = np.concatenate([self.lat, np.asarray(lat, dtype=np.float64)])
        self.k = np.concatenate([self.k, k])
        self.cap = np.concatenate([self.cap, cap])
        self.alive = np.concatenate([self.alive, np.ones(n, dtype=bool)])
        self.radius = np.concatenate([self.radius, radii])
        self.reach = np.concatenate([self.reach, np.column_stack([unit_vectors(lon, lat), chord2_bound(radii)])])
        self.top_ptr = np.concatenate([self.top_ptr, len(self.top_d) + start])
        self.top_d = np.concatenate([self.top_d, top_d])
        self.top_h = np.concatenate([self.top_h, top_h])
        self.count = np.concatenate([self.count, count])
        if self._details is not None:
            held = {o for top in topk for o, _ in top}
            self._details.update({o: info for o, info in objects.items() if o in held})
        self._key_handles()
        self._live_handles = max(self._live_handles, len(self.oids))
        self.load.extend(first + n)
        return range(first, first + n)

    def _entries(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, keyword code)`` int64 index entries of ``slots`` (one per query keyword)."""
        slots = np.asarray(slots, dtype=np.int64)
        a = self.kw_ptr[slots]
        n = self.kw_ptr[slots + 1] - a
        return np.repeat(slots, n), self.kw_code[runs(a, n)]

    def rebuild_index(self) -> float:
        """Rebuild the query index from the current radii; returns seconds spent."""
        t0 = time.perf_counter()
        slot, code = self._entries(np.flatnonzero(self.alive))
        self.index.rebuild(slot, code, self.lon[slot], self.lat[slot], self.radius[slot])
        return time.perf_counter() - t0

    def _refresh(self, slots: np.ndarray) -> None:
        """Re-index queries whose region changed (shrunk, new, removed)."""
        slots = np.asarray(slots, dtype=np.int64)
        slot, code = self._entries(slots[self.alive[slots]])
        self.index.refresh(slots, slot, code, self.lon[slot], self.lat[slot], self.radius[slot])
        self.refreshed += len(slots)

    def _fields(self, slot: int) -> dict[str, Any]:
        return {"lon": repr(float(self.lon[slot])), "lat": repr(float(self.lat[slot])),
                "keywords": self.keywords[slot], "k": int(self.k[slot])}

    def _write_now(self, fn, *args) -> Any:
        """Call a writer method now, after any batch writes still queued (in stream order)."""
        return self.queue.now(fn, *args) if self.queue is not None else fn(*args)

    def written(self, batch: int) -> WriteFigures:
        """Wait until batch ``batch``'s changes are in Redis (with ``overlap_writes``); the
        write's figures (all 0 without ``overlap_writes`` or when the batch changed nothing).

        Raises
        ------
        StoreUnavailableError
            The write, or an earlier one, failed after every retry.
        """
        return self.queue.wait(batch) if self.queue is not None else WriteFigures()

    def _next_tag(self) -> int:
        self._tag -= 1  # initial loads and registrations use negative tags, batches their number
        return self._tag

    def load_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                     objects: Mapping[str, ObjectInfo], *, version: int = 0, write: bool = True,
                     details: bool = False, sets: Sequence[int] | None = None, chunk: int = 5000,
                     vocabulary: Mapping[str, int] | None = None, rebuild: bool = True) -> dict[str, Any]:
        """Take queries with their initial kNN (exact over the objects seen so far).

        Parameters
        ----------
        queries
            ``m`` valid queries (validated where they entered knnmon).
        topk
            ``m`` lists of ``(object id, distance m)``: each query's exact kNN so far (with a
            reserve, its ``k + reserve`` nearest).
        objects
            Details of every object in those lists (for ``knn:objects:{worker}``).
        version
            The change feed's version of their initial results: the stream batches applied so
            far (:class:`~knnmon.batch.BatchChanges`).
        write
            Write the queries and results to Redis; ``False`` when Redis holds them already
            (a service resuming after it reconciled them, a worker revived).
        details
            With ``write=False``: write ``objects`` into ``knn:objects:{worker}`` (a resuming
            service's plan may have moved queries between workers); else they are there.
        sets
            ``m`` ints: each query's set in the plan, written as its hash's ``set`` field
            (``knnmon explain``).
        chunk
            Queries per Redis script call.
        vocabulary
            The coordinator's codes of their keywords (it encodes batches with them).
        rebuild
            Rebuild the query index now; ``False`` for all but the last of several loads in a
            row (the coordinator hands a worker its queries in parts, to bound the payloads).

        Returns
        -------
        dict
            ``queries``, ``index_entries``, ``seconds``.
        """
        t0 = time.perf_counter()
        self._learn(vocabulary)
        slots = self._append(queries, topk, objects)
        first = slots.start
        if self.writer is not None and not write:
            for j in range(slots.start, slots.stop):
                self.writer.hold(self.qids[j], (oid for oid, _ in self._result(j)))
            held = self.writer.held if details else {}  # (a property: merged once, not per object)
            mine = {oid: o for oid, o in objects.items() if oid in held}
            if mine:  # (a reserve's objects beyond k are in no result)
                tag = self._next_tag()
                self._write_now(self.writer.apply, tag, self.writer.details_payload(tag, mine))
        if self.writer is not None and write:
            # With the write queue, Redis runs chunk i's script while this thread builds the
            # payload of chunk i + 1 (at most 2 chunks wait, to bound memory).
            queued: deque = deque()
            for s in range(slots.start, slots.stop, chunk):
                rows = [(self.qids[j], self._fields(j) if sets is None else {**self._fields(j), "set": sets[j - first]},
                         self._result(j)) for j in range(s, min(s + chunk, slots.stop))]
                tag = self._next_tag()
                payload = self.writer.queries_payload(tag, rows, objects, version)
                if self.queue is None:
                    self.writer.apply(tag, payload)
                    continue
                queued.append(self.queue.submit(self.writer.apply, tag, payload))
                if len(queued) > 2:
                    queued.popleft().result()
            for f in queued:
                f.result()
        if rebuild:
            self.rebuild_index()
            give_back()  # the load's payloads
        return {"queries": len(queries), "index_entries": self.index.entries, "seconds": time.perf_counter() - t0}

    def register_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                         objects: Mapping[str, ObjectInfo], vocabulary: Mapping[str, int] | None = None,
                         version: int = 0) -> None:
        """Add queries at run time with their initial kNN (one Redis script call for all); they
        are candidates from the next batch on. Arguments as :meth:`load_queries`;
        ``vocabulary`` gives the codes of their keywords when the coordinator encodes batches.

        Raises
        ------
        InvalidQueryError
            An id this worker holds already.
        """
        self._learn(vocabulary)
        slots = self._append(queries, topk, objects)
        if self.writer is not None:
            self._write_now(self.writer.write_queries, self._next_tag(),
                            [(self.qids[j], self._fields(j), self._result(j)) for j in slots], objects, version)
        self._refresh(np.arange(slots.start, slots.stop))

    def unregister_query(self, qid: str, version: int = 0) -> bool:
        """Remove a query and delete its Redis keys (its feed line at ``version``, as
        :meth:`register_queries`); ``False`` if this worker does not hold it."""
        slot = self.slot_of.get(qid)
        if slot is None:
            return False
        if self.writer is not None:
            self._write_now(self.writer.delete_query, self._next_tag(), qid, version,
                            [oid for oid, _ in self._result(slot)])
        self._drop([qid])
        return True

    def _drop(self, qids: Sequence[str]) -> None:
        """Forget queries this worker holds (no Redis write): their slots die, their places and
        handles are released (compacting when enough are), the index forgets their regions."""
        slots = np.array([self.slot_of.pop(q) for q in qids], dtype=np.int64)
        if not len(slots):
            return
        self.alive[slots] = False
        self.reach[slots, 3] = -1.0
        places = runs(self.top_ptr[slots], self.cap[slots])
        self.top_d[places], self.top_h[places], self.count[slots] = np.inf, -1, 0
        self._released += int(self.cap[slots].sum())
        self.load.clear(slots)
        self._refresh(slots)
        if self._released > max(COMPACT_MIN, len(self.top_d) // 2):
            self.compact()

    def compact(self) -> None:
        """Release what unregistered queries left: their slots (the live queries are
        renumbered), their top-k places, and the handles of objects no result holds; then
        rebuild the query index. O(sum of k + index entries)."""
        keep = np.flatnonzero(self.alive)
        n_kw = self.kw_ptr[keep + 1] - self.kw_ptr[keep]
        self.kw_code = self.kw_code[runs(self.kw_ptr[keep], n_kw)]
        self.kw_ptr = np.concatenate([[0], np.cumsum(n_kw)]).astype(np.int64)
        places = runs(self.top_ptr[keep], self.cap[keep])
        self.top_d, self.top_h = self.top_d[places], self.top_h[places]
        self.top_ptr = np.cumsum(self.cap[keep]) - self.cap[keep]
        for name in ("lon", "lat", "k", "cap", "radius", "reach", "count"):
            setattr(self, name, getattr(self, name)[keep])
        self.alive = np.ones(len(keep), dtype=bool)
        self.qids = [self.qids[s] for s in keep.tolist()]
        self.keywords = [self.keywords[s] for s in keep.tolist()]
        self.slot_of = {qid: s for s, qid in enumerate(self.qids)}
        self.load.keep(keep)
        self._released = 0
        self._compact_handles()
        self.rebuild_index()

    def _compact_handles(self) -> None:
        """Drop the handles of objects no result holds (renumbering the others). O(sum of k)."""
        held = self.top_h >= 0
        used = np.unique(self.top_h[held])
        self.oids = [self.oids[h] for h in used.tolist()]
        self.handle_of = {oid: h for h, oid in enumerate(self.oids)}
        remap = np.zeros(len(self._oid_key), dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.top_h = np.where(held, remap[np.maximum(self.top_h, 0)], -1)
        self._oid_key = self._oid_key[used]
        self._t = self._t[used]
        if self._details is not None:
            self._details = {oid: self._details[oid] for oid in self.oids if oid in self._details}
        self._keyed = self._live_handles = len(used)

    def _result(self, slot: int) -> list[tuple[str, float]]:
        """The row as stored: nearest first, ties at equal distance in any order (Redis orders a
        sorted set's ties by member itself, so the writes need no sort)."""
        a, c = int(self.top_ptr[slot]), int(min(self.count[slot], self.k[slot]))
        return list(zip((self.oids[h] for h in self.top_h[a:a + c].tolist()), self.top_d[a:a + c].tolist()))

    def regions(self) -> tuple[QueryColumns, np.ndarray]:
        """The registered queries and their kNN radii ``r_q`` (``(m,)`` float64 meters, ``inf``
        below ``k`` results): what the routing table must cover for this worker."""
        live = np.flatnonzero(self.alive)
        sel = live.tolist()
        return (QueryColumns([self.qids[j] for j in sel], self.lon[live], self.lat[live],
                             [self.keywords[j].split() for j in sel], self.k[live].copy()), self.radius[live].copy())

    def result(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` by (distance, id)."""
        return sorted(self._result(self.slot_of[qid]), key=lambda e: (e[1], e[0]))

    # -- the window ----------------------------------------------------------------------------
    def expire(self, cutoff: int) -> QueryColumns:
        """Remove the objects with ``t <= cutoff`` (epoch ms) from every list held here.

        Every live matching object strictly within a query's ``r_q`` is in its list (``r_q`` is
        the list's last distance when it was last full, ``inf`` if it never was). So a list that
        lost objects still starts with the exact kNN if at least ``k`` of what is left lie
        strictly within ``r_q`` (objects tied at exactly ``r_q`` may be missing); otherwise the
        query is returned, to be refilled with its exact ``k + reserve`` nearest over the live
        objects (:meth:`process_batch`'s ``refills``). A list with ``r_q = inf`` held every
        matching live object and just shrinks. The results as they were are kept until the
        batch's write, which sends each changed result's whole difference (``left`` and
        ``entered``). Calling it again with a cutoff not larger does nothing. O(sum of k +
        reserve) per call.

        Returns
        -------
        QueryColumns
            The queries to refill, ``k`` holding the neighbours to search (``k + reserve``).
        """
        none = QueryColumns([], np.empty(0), np.empty(0), [], np.empty(0, dtype=np.int64))
        if cutoff <= self._cutoff:
            return none
        before, self._cutoff = self._cutoff, int(cutoff)
        n = len(self.oids)
        dead = self._t[:n] <= cutoff
        if not n or not dead.any():
            return none
        for h in np.flatnonzero(dead & (self._t[:n] > before)).tolist():
            self.handle_of.pop(self.oids[h], None)  # an id published again later is a new object
            if self._details is not None:
                self._details.pop(self.oids[h], None)
        held = self.top_h >= 0
        hit = np.zeros(len(self.top_h), dtype=bool)
        hit[held] = dead[self.top_h[held]]
        places = np.flatnonzero(hit)
        if not len(places):
            return none
        self.expired += len(places)
        of = np.searchsorted(self.top_ptr, places, side="right") - 1
        slots = np.unique(of)
        # Results that lost an entry (not only their reserve): diffed at the write, re-sorted.
        in_res = np.unique(of[places - self.top_ptr[of] < np.minimum(self.count[of], self.k[of])])
        n_res = np.minimum(self.count[in_res], self.k[in_res])
        res_slot, res_h = np.repeat(in_res, n_res), self.top_h[runs(self.top_ptr[in_res], n_res)]
        if self._before is None:
            self._before = (res_slot, res_h)
        else:  # a second expiry before the write: the first one's results are what Redis holds
            seen = np.isin(res_slot, self._before[0])
            self._before = tuple(np.concatenate([b, x[~seen]]) for b, x in zip(self._before, (res_slot, res_h)))
        c = self.count[slots]
        at = runs(self.top_ptr[slots], c)
        keep = ~hit[at]
        s_keep, h_keep, d_keep = np.repeat(slots, c)[keep], self.top_h[at][keep], self.top_d[at][keep]
        whole = runs(self.top_ptr[slots], self.cap[slots])
        self.top_d[whole], self.top_h[whole] = np.inf, -1
        pos = np.arange(len(s_keep)) - np.searchsorted(s_keep, s_keep, side="left")
        self.top_d[self.top_ptr[s_keep] + pos], self.top_h[self.top_ptr[s_keep] + pos] = d_keep, h_keep
        self.count[slots] = np.bincount(np.searchsorted(slots, s_keep), minlength=len(slots))
        if self.reserve and len(in_res):
            self._sort_lists(in_res)  # ties now at the k-th place decide by id
        # Exact still iff k of what is left lie strictly within r_q (the docstring above).
        r = self.radius[s_keep]
        below = np.bincount(np.searchsorted(slots, s_keep[d_keep < r]), minlength=len(slots))
        need = slots[np.isfinite(self.radius[slots]) & (below < self.k[slots])]
        sel = need.tolist()
        return QueryColumns([self.qids[j] for j in sel], self.lon[need], self.lat[need],
                            [self.keywords[j].split() for j in sel], self.cap[need].copy())

    def _sort_lists(self, slots: np.ndarray) -> None:
        """Order the held entries of ``slots`` by (distance, object id) in place."""
        c = self.count[slots]
        at = runs(self.top_ptr[slots], c)
        S, D, H = np.repeat(slots, c), self.top_d[at], self.top_h[at]
        key = self._oid_key[H]
        order = np.lexsort((key, D, S))
        S, D, H, key = S[order], D[order], H[order], key[order]
        same = (S[1:] == S[:-1]) & (D[1:] == D[:-1]) & (key[1:] == key[:-1])
        if same.any():  # shared 8-byte prefixes: those queries' lists by the ids themselves
            for j in np.unique(S[1:][same]).tolist():
                run = np.flatnonzero(S == j)
                by = sorted(run.tolist(), key=lambda i: (D[i], self.oids[H[i]]))
                D[run], H[run] = D[by], H[by]
        self.top_d[at], self.top_h[at] = D, H

    def _refill(self, refills: Refills) -> None:
        """Replace the results of :meth:`expire`'s queries with their exact kNN over the live
        objects; ``r_q`` grows back (the query is re-indexed with its larger region)."""
        slots = []
        for qid, top in zip(refills.qids, refills.topk):
            j = self.slot_of.get(qid)
            if j is None:
                continue
            a, kk = int(self.top_ptr[j]), int(self.cap[j])
            lst = sorted((float(d), str(o)) for o, d in top)[:kk]
            self.top_d[a:a + kk], self.top_h[a:a + kk] = np.inf, -1
            for i, (d, o) in enumerate(lst):
                self.top_d[a + i], self.top_h[a + i] = d, self._handle_in(o, refills.objects)
            self.count[j] = len(lst)
            self.radius[j] = lst[-1][0] if len(lst) == kk else np.inf
            slots.append(j)
        if not slots:
            return
        slots = np.asarray(slots, dtype=np.int64)
        self.reach[slots, 3] = chord2_bound(self.radius[slots])
        if self._details is not None:
            self._details.update(refills.objects)
        else:
            self._refilled.update(refills.objects)
        self._key_handles()
        self._refresh(slots)
        self.refills += len(slots)

    def _window_changes(self, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                        keywords: Sequence[Sequence[str]], m: Merge | None) -> tuple[BatchChanges, np.ndarray]:
        """The batch's changes when an expiry touched results: each touched or changed result's
        difference to what Redis holds (before the expiry, or before the merge), as
        :class:`BatchChanges`, and the sorted slots written."""
        none = np.empty(0, dtype=np.int64)
        old_slot, old_h = self._before if self._before is not None else (none, none)
        touched = np.unique(old_slot)
        merged = m.in_result if m is not None else none
        if len(merged):
            b_slot, b_h = m.before
            fresh = np.zeros(len(self.k), dtype=bool)
            fresh[merged] = True
            fresh[touched] = False  # an expired result's 'before' is the expiry's
            fresh = fresh[b_slot]
            old_slot, old_h = np.concatenate([old_slot, b_slot[fresh]]), np.concatenate([old_h, b_h[fresh]])
        slots = np.union1d(touched, merged)
        c = np.minimum(self.count[slots], self.k[slots])
        at = runs(self.top_ptr[slots], c)
        new_slot, new_h, new_d = np.repeat(slots, c), self.top_h[at], self.top_d[at]
        ko, kn = (old_slot << 32) | old_h, (new_slot << 32) | new_h
        ent, left = ~np.isin(kn, ko), ~np.isin(ko, kn)
        changed = np.union1d(new_slot[ent], old_slot[left])
        order = np.argsort(old_slot[left], kind="stable")
        at_batch = {oid: j for j, oid in enumerate(ids)}
        info = {}
        for h in np.unique(new_h[ent]).tolist():
            oid = self.oids[h]
            j = at_batch.get(oid)
            info[oid] = (ObjectInfo(float(lon[j]), float(lat[j]), int(t[j]), keywords[j]) if j is not None
                         else (self._details if self._details is not None else self._refilled)[oid])
        self._before, self._refilled = None, {}
        return self._batch_changes(changed, new_slot[ent], new_h[ent], new_d[ent], old_slot[left][order],
                                   old_h[left][order], info), changed

    def _batch_changes(self, changed: np.ndarray, e_slot: np.ndarray, e_h: np.ndarray, e_d: np.ndarray,
                       l_slot: np.ndarray, l_h: np.ndarray, info: Mapping[str, ObjectInfo]) -> BatchChanges:
        """:class:`BatchChanges` of the results ``changed`` (sorted slots): handles ``e_h`` (at
        ``e_d`` meters) entered and ``l_h`` left them, each grouped by their slot (``e_slot``,
        ``l_slot``) in slot order; ``info`` holds the entered objects' details. Fresh lists, so a
        queued write may use them while the next batch runs."""
        oids = self.oids
        return BatchChanges(
            qids=[self.qids[s] for s in changed.tolist()],
            n_entered=np.bincount(np.searchsorted(changed, e_slot), minlength=len(changed)).tolist(),
            entered=[oids[h] for h in e_h.tolist()], distances=e_d.tolist(),
            n_left=np.bincount(np.searchsorted(changed, l_slot), minlength=len(changed)).tolist(),
            left=[oids[h] for h in l_h.tolist()], objects=info, version=self._version)

    # -- objects -----------------------------------------------------------------------------
    def encode(self, keywords: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """(object, keyword code) pairs of a batch, keywords no query has left out."""
        pair_obj, pair_code = [], []
        for j, words in enumerate(keywords):
            for w in words:
                c = self.vocab.get(w)
                if c is not None:
                    pair_obj.append(j)
                    pair_code.append(c)
        return np.asarray(pair_obj, dtype=np.int64), np.asarray(pair_code, dtype=np.int64)

    def _update(self, ids: Sequence[str], times: np.ndarray, lon: np.ndarray, lat: np.ndarray, obj: np.ndarray,
                slot: np.ndarray) -> Merge | None:
        """Merge a batch's candidate pairs ``(obj, slot)`` (``(c,)`` int64 each, from the query
        index) into the touched queries' top-k lists: the chord pre-test, the haversine distance
        and the merge with ties by id, in :mod:`~knnmon.workers.kernels`; then handles for the
        objects that entered. ``None`` if no pair lies within its ``r_q``."""
        if not len(obj):
            return None
        u = unit_vectors(lon, lat)
        sel = kernels.chord_pretest(*(np.ascontiguousarray(u[:, i]) for i in range(3)), obj, slot, self.reach)
        obj, slot = obj[sel], slot[sel]
        d = haversine_m(lon[obj], lat[obj], self.lon[slot], self.lat[slot])
        within = np.unique(obj[d <= self.radius[slot]])
        if not len(within):
            return None
        okey = np.zeros(len(lon), dtype=np.uint64)
        okey[within] = id_prefix_keys([ids[j] for j in within.tolist()])
        (passed, changed, in_result, e_slot, e_obj, e_d, e_place, l_slot, l_h, b_slot, b_h, fallback, f_slot, f_obj,
         f_d) = kernels.merge_topk(obj, slot, d, okey, self.radius, self.k, self.cap, self.top_ptr, self.count,
                                   self.top_d, self.top_h, self._oid_key, len(lon))
        m = Merge(int(passed[0]), changed, in_result, e_slot, e_obj, e_d, e_place, l_slot, l_h, b_slot, b_h)
        if len(fallback):
            m = m.plus(self._merge_by_ids(ids, fallback, f_slot, f_obj, f_d))
        uniq = np.unique(m.e_obj)
        handles = np.array([self._handle(ids[j], int(times[j])) for j in uniq.tolist()], dtype=np.int64)
        m.e_h = handles[np.searchsorted(uniq, m.e_obj)]
        m.entered_obj = uniq
        self.top_h[m.e_place] = m.e_h
        self._key_handles()
        return m

    def _merge_by_ids(self, ids: Sequence[str], slots: np.ndarray, f_slot: np.ndarray, f_obj: np.ndarray,
                      f_d: np.ndarray) -> Merge:
        """:func:`~knnmon.workers.kernels.merge_topk` for the queries it left to the ids
        themselves (entries at equal distance sharing an 8-byte id prefix across the ``k``-th or
        last place): each list and its new pairs sorted by (distance, id) in Python."""
        out: dict[str, list] = {name: [] for name in Merge.ARRAYS}
        for s in slots.tolist():
            a, c, kk, cp = int(self.top_ptr[s]), int(self.count[s]), int(self.k[s]), int(self.cap[s])
            mine = f_slot == s
            merged = sorted([(d, self.oids[h], h) for d, h in zip(self.top_d[a:a + c].tolist(),
                                                                   self.top_h[a:a + c].tolist())]
                            + [(d, ids[o], -1 - o) for d, o in zip(f_d[mine].tolist(), f_obj[mine].tolist())])
            kept = merged[:cp]
            new_at = [i for i, e in enumerate(kept) if e[2] < 0]
            if not new_at:
                continue
            out["changed"].append(s)
            if new_at[0] < kk:
                out["in_result"].append(s)
            out["b_slot"] += [s] * min(c, kk)
            out["b_h"] += self.top_h[a:a + min(c, kk)].tolist()
            for i in new_at:
                out["e_slot"].append(s)
                out["e_obj"].append(-1 - kept[i][2])
                out["e_d"].append(kept[i][0])
                out["e_place"].append(a + i)
            for d, _, h in merged[cp:]:
                if h >= 0:
                    out["l_slot"].append(s)
                    out["l_h"].append(h)
            self.top_d[a:a + len(kept)] = [e[0] for e in kept]
            self.top_h[a:a + len(kept)] = [e[2] for e in kept]
            self.count[s] = len(kept)
        return Merge(0, **{name: np.asarray(v, dtype=np.float64 if name == "e_d" else np.int64)
                           for name, v in out.items()})

    def process_batch(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                      keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None = None, *,
                      cutoff: int | None = None, refills: Refills | None = None,
                      rows: np.ndarray | None = None) -> WorkerReport:
        """Update every affected kNN for a batch of objects and write the changes to Redis.

        Parameters
        ----------
        batch
            The batch number (``>= 0``; the idempotency tag of the Redis transaction).
        ids, lon, lat, t, keywords
            ``n`` objects: string ids, degrees, epoch ms, normalised keywords. Ids must be new
            (the coordinator drops duplicates).
        pairs
            Optional ``(object index, keyword code)`` int64 arrays, pre-encoded with the shared
            vocabulary (else :meth:`encode` computes them).
        cutoff
            With a window: the batch's expiry cutoff (:meth:`expire`, if not called already).
        refills
            With a window: the exact kNN over the live objects (before this batch) of the queries
            :meth:`expire` asked to refill, applied before the batch's objects.
        rows
            ``(n,)`` int64: the objects' rows in the shared batch (:meth:`process_rows`), which
            a batch released in parts records (default ``0..n-1``).

        Returns
        -------
        WorkerReport
            With ``overlap_writes`` and a changed result, the write is queued
            (``write_queued``) and its figures come from :meth:`written`. Released in parts
            (``release_groups > 1``), ``released`` holds each row's release time.
        """
        t0, c0 = time.perf_counter(), time.thread_time()
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        t = np.asarray(t, dtype=np.int64)
        self._version = batch + 1  # the change feed's version of this batch's changes
        if self.track_load:
            self.load.tick()
        if cutoff is not None:
            self.expire(cutoff)
        if refills is not None:
            self._refill(refills)
        if self.release_groups > 1 and len(ids) > 1 and self.queue is None:
            rows = np.arange(len(ids), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
            report = self._process_in_parts(batch, ids, lon, lat, t, keywords, pairs, rows)
            return replace(report, busy_s=time.perf_counter() - t0,
                           cpu_s=time.thread_time() - c0 + report.redis_server_s,
                           refilled=len(refills.qids) if refills is not None else 0)
        obj = slot = np.empty(0, dtype=np.int64)
        if len(ids):
            po, pc_ = pairs if pairs is not None else self.encode(keywords)
            obj, slot = self.index.candidates(lon, lat, po, pc_)
        m, changed, changes, written = self._apply(ids, lon, lat, t, keywords, obj, slot)
        busy_core = time.perf_counter() - t0
        t1 = time.perf_counter()
        server_s = 0.0
        if len(written) and self.writer is not None:
            if self.queue is not None:
                self.queue.submit_batch(batch, changes)
            else:
                server_s = self.writer.write_batch(batch, changes)
        redis_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        if len(changed):
            self._shrink(changed)
        if len(self.oids) > max(COMPACT_MIN, 4 * self._live_handles):
            self._compact_handles()  # objects that left every result: their handles released
        index_s = time.perf_counter() - t2
        released = None
        if self.release_groups > 1:  # (one object, or queued writes: released whole, now)
            rows = np.arange(len(ids), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
            released = (rows, np.full(len(ids), time.time() * 1e3))
        return WorkerReport(worker=self.worker_id, batch=batch, objects=len(ids), candidates=len(obj),
                            passed=m.passed if m is not None else 0, changed=len(written), busy_s=busy_core + redis_s + index_s,
                            cpu_s=time.thread_time() - c0 + server_s, redis_s=redis_s, redis_server_s=server_s,
                            index_s=index_s, write_queued=self.queue is not None and bool(len(written)),
                            refilled=len(refills.qids) if refills is not None else 0, released=released)

    def _apply(self, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
               keywords: Sequence[Sequence[str]], obj: np.ndarray, slot: np.ndarray
               ) -> tuple[Merge | None, np.ndarray, BatchChanges | None, np.ndarray]:
        """One batch (or one part of it): merge the candidate pairs ``(obj, slot)`` (:meth:`_update`),
        keep the entered objects' details (a reserve), charge the load, and build the changes
        to write: ``(merge, changed slots, changes or None, written slots)``. With an expiry not
        yet written or a reserve, the changed results are diffed whole (:meth:`_window_changes`)."""
        m = self._update(ids, t, lon, lat, obj, slot)
        changed = m.changed if m is not None else np.empty(0, dtype=np.int64)
        if m is not None and self._details is not None:
            for j in m.entered_obj.tolist():
                self._details[ids[j]] = ObjectInfo(float(lon[j]), float(lat[j]), int(t[j]), keywords[j])
        if self.track_load:
            self.load.charge(obj, slot, changed)
        changes, written = None, changed
        if self._before is not None or (m is not None and self.reserve):
            changes, written = self._window_changes(ids, lon, lat, t, keywords, m)
        elif len(changed) and self.writer is not None:
            changes = self._changes(ids, lon, lat, t, keywords, m)
        return m, changed, changes, written

    def _groups(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray
                ) -> Iterator[SearchGroup]:
        """The batch's objects in Short-Job-First groups with their candidate pairs, at most
        ``release_groups`` of them: the R-tree index's BatchSearch, else the exact candidates
        grouped by their count per object (:func:`sjf_groups`)."""
        size = -(-len(lon) // self.release_groups)
        if isinstance(self.index, RTreeIndex):
            return self.index.batch_search(lon, lat, pair_obj, pair_code, group=size)
        return sjf_groups(*self.index.candidates(lon, lat, pair_obj, pair_code), len(lon), size)

    def _process_in_parts(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                          keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None,
                          rows: np.ndarray) -> WorkerReport:
        """:meth:`process_batch` released in parts (``release_groups``): an expiry's changes
        first, then group by group in Short-Job-First order, each group's objects merged, its
        changes written (:meth:`ResultWriter.write_part`) and its shrunk radii applied before
        the next group is searched; the index is re-indexed once, at the end (a shrunk region
        lies inside its indexed one, so the later groups' candidates stay a superset)."""
        none, n = np.empty(0, dtype=np.int64), len(ids)
        released = np.zeros(n)
        part, server_s, redis_s = 0, 0.0, 0.0
        n_candidates = n_passed = n_written = 0
        shrunk: list[np.ndarray] = []

        def write(changes: BatchChanges | None, objs: np.ndarray, last: bool) -> None:
            nonlocal part, server_s, redis_s
            if self.writer is not None:
                t1 = time.perf_counter()
                changes = changes if changes is not None else BatchChanges([], [], [], [], [], [],
                                                                          version=self._version)
                server_s += self.writer.write_part(batch, part, last, rows[objs].tolist(), changes)
                redis_s += time.perf_counter() - t1
            part += 1

        if self._before is not None:  # an expiry touched results: its changes are part 0
            changes, written = self._window_changes(ids, lon, lat, t, keywords, None)
            if len(written):
                write(changes, none, False)
                n_written += len(written)
        po, pc = pairs if pairs is not None else self.encode(keywords)
        groups = self._groups(lon, lat, po, pc)
        n_groups = -(-n // (-(-n // self.release_groups)))
        for g, grp in enumerate(groups):
            last = g == n_groups - 1
            n_candidates += len(grp.obj)
            m, changed, changes, written = self._apply(ids, lon, lat, t, keywords, grp.obj, grp.slot)
            n_passed += m.passed if m is not None else 0
            if len(written) or (last and part > 0):
                write(changes, grp.objects, last)
                n_written += len(written)
            released[grp.objects] = time.time() * 1e3
            if len(changed):
                shrunk.append(self._shrink(changed, refresh=False))
        t2 = time.perf_counter()
        if shrunk:
            self._refresh(np.unique(np.concatenate(shrunk)))
        if len(self.oids) > max(COMPACT_MIN, 4 * self._live_handles):
            self._compact_handles()
        index_s = time.perf_counter() - t2
        return WorkerReport(worker=self.worker_id, batch=batch, objects=n, candidates=n_candidates,
                            passed=n_passed, changed=n_written, busy_s=0.0, redis_s=redis_s, redis_server_s=server_s,
                            index_s=index_s, released=(rows, released))

    def _shrink(self, changed: np.ndarray, *, refresh: bool = True) -> np.ndarray:
        """Shrink the kNN radius ``r_q`` of the ``changed`` slots whose list is full to its
        k-th (last kept) distance; re-index them unless ``refresh=False``. Returns the shrunk
        slots."""
        kth = self.top_d[self.top_ptr[changed] + self.cap[changed] - 1]  # inf unless the list is full
        shrink = kth < self.radius[changed]
        slots = changed[shrink]
        if len(slots):
            self.radius[slots] = kth[shrink]
            self.reach[slots, 3] = chord2_bound(kth[shrink])
            if refresh:
                self._refresh(slots)
        return slots

    def estimate_rows(self, batch: ObjectBatch, rows: np.ndarray) -> np.ndarray:
        """Wang, Zhang and Kitsuregawa's EstimateWorkload for this worker's rows of a batch (no
        state changes): each row's candidate (object, query) pairs in the query index, the cost
        that drives its processing. For Short-Job-First minibatches in ``knnmon serve``
        (:mod:`knnmon.coordinator.service.batching`).

        Parameters
        ----------
        batch
            A batch as :meth:`process_rows` takes it (its number is not used).
        rows
            ``(m,)`` int64: this worker's rows.

        Returns
        -------
        numpy.ndarray
            ``(m,)`` int64 candidates per row.
        """
        rows = np.asarray(rows, dtype=np.int64)
        lon = batch.table.column("lon").to_numpy()[rows]
        lat = batch.table.column("lat").to_numpy()[rows]
        obj, _ = self.index.candidates(lon, lat, *_pairs_of_rows(batch, rows))
        return np.bincount(obj, minlength=len(rows)).astype(np.int64)

    def process_rows(self, batch: ObjectBatch, rows: np.ndarray, *, cutoff: int | None = None,
                     refills: Refills | None = None) -> WorkerReport:
        """:meth:`process_batch` for the rows ``rows`` (``(m,)`` int64: this worker's objects)
        of a batch that every worker shares; selecting them is part of this worker's work.
        ``cutoff`` and ``refills`` as in :meth:`process_batch`."""
        t0, c0 = time.perf_counter(), time.thread_time()
        table = batch.table
        rows = np.asarray(rows, dtype=np.int64)
        part = table.take(rows)
        args = (batch.number, part.column("id").to_pylist(), part.column("lon").to_numpy(),
                part.column("lat").to_numpy(), part.column("t").to_numpy(), part.column("keywords").to_pylist(),
                _pairs_of_rows(batch, rows))
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        report = self.process_batch(*args, cutoff=cutoff, refills=refills, rows=rows)
        return replace(report, busy_s=report.busy_s + wall, cpu_s=report.cpu_s + cpu)

    def _changes(self, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                 keywords: Sequence[Sequence[str]], m: Merge) -> BatchChanges:
        """A batch's changes from :meth:`_update`'s merge (no reserve, no expiry: every kept new
        entry entered a result, every dropped old one left it), per changed query in slot order."""
        info = {ids[j]: ObjectInfo(float(lon[j]), float(lat[j]), int(t[j]), keywords[j]) for j in m.entered_obj.tolist()}
        return self._batch_changes(m.changed, m.e_slot, m.e_h, m.e_d, m.l_slot, m.l_h, info)

    def stats(self) -> dict[str, Any]:
        """Queries held, index entries, queries re-indexed so far, list entries expired and results
        refilled so far (a window), this process's peak and current RSS and its current anonymous
        RSS (MB; the current ones ``None`` where there is no ``/proc``:
        :func:`~knnmon.heap.resident_bytes`), its process id, and the Ray node it runs on
        (``None`` outside Ray)."""
        import resource

        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return {"worker": self.worker_id, "node": node, "pid": os.getpid(), "queries": int(self.alive.sum()),
                "expired": self.expired, "refilled": self.refills,
                "index_entries": self.index.entries,
                "refreshed": self.refreshed, "keywords": len(self.vocab),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_mb": _mb(resident_bytes()), "rss_anon_mb": _mb(resident_bytes("RssAnon"))}
