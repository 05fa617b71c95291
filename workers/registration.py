"""A worker taking and dropping queries: the initial load, registrations and unregisters at run
time, and the compaction that releases what dropped queries left."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from knnmon.batch import BatchChanges, KnnColumns, ObjectInfo
from knnmon.encoding import id_prefix_keys
from knnmon.heap import give_back
from knnmon.query import QueryColumns
from knnmon.reports import LoadResult
from knnmon.workers.holders import texts_of
from knnmon.workers.state import WorkerState
from knnmon.workers.window_lists import WindowLists

__all__ = ["Registration", "kept_entries"]

def kept_entries(topk: Sequence[Sequence[tuple[str, float]]], cap: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Each query's list ordered by (distance, object id) and cut to its ``cap`` places.

    Parameters
    ----------
    topk
        ``n`` lists of ``(object id, distance m)``, in any order (or
        :class:`~knnmon.batch.KnnColumns`, read as columns).
    cap
        ``(n,)`` int64: places per query.

    Returns
    -------
    query, rank, distance, ids, keys
        The kept entries, by query then place: ``(e,)`` int64 query index and place, ``(e,)``
        float64 meters, their ``e`` ids and ``(e,)`` uint64 id prefix keys
        (:func:`~knnmon.encoding.id_prefix_keys`). Sorted on the keys, and by the ids themselves
        within a query whose entries share a distance and a key.
    """
    n = len(topk)
    columns = isinstance(topk, KnnColumns)
    sizes = topk.counts if columns else np.fromiter(map(len, topk), dtype=np.int64, count=n)
    total = int(sizes.sum())
    if not total:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), [], np.zeros(0, np.uint64)
    if columns:
        oids, d = list(topk.ids), topk.dist
    else:
        oids, dists = zip(*chain.from_iterable(topk))
        oids = [str(o) for o in oids]
        d = np.asarray(dists, dtype=np.float64)
    q = np.repeat(np.arange(n, dtype=np.int64), sizes)
    key = id_prefix_keys(oids)
    order = np.lexsort((key, d, q))
    q, d, key = q[order], d[order], key[order]
    oids = [oids[i] for i in order.tolist()]
    same = (q[1:] == q[:-1]) & (d[1:] == d[:-1]) & (key[1:] == key[:-1])
    for j in np.unique(q[1:][same]).tolist():  # shared prefixes at a tie: those lists by the ids
        a, b = np.searchsorted(q, j), np.searchsorted(q, j, side="right")
        run = sorted(range(a, b), key=lambda i: (d[i], oids[i]))
        d[a:b], key[a:b] = d[run], key[run]
        oids[a:b] = [oids[i] for i in run]
    rank = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    keep = rank < cap[q]
    return q[keep], rank[keep], d[keep], [o for o, k in zip(oids, keep.tolist()) if k], key[keep]


class Registration:
    """The registration part of a :class:`~knnmon.workers.worker.KnnWorker` (module docstring),
    over its :class:`~knnmon.workers.state.WorkerState`; a compaction renumbers the slots the
    ``window`` waits to refill."""

    def __init__(self, state: WorkerState, window: WindowLists) -> None:
        self.state, self.window = state, window

    def append(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
               objects: Mapping[str, ObjectInfo], first_k: bool = False) -> range:
        """Add valid queries in bulk (one array concatenation); returns their slots. A list
        holding its ``k + reserve`` places gets its last distance as ``r_q``; with ``first_k``
        (each list is a result as Redis holds it: the exact kNN, no reserve) one holding ``k``
        gets its ``k``-th distance. A shorter list held every matching object: ``r_q = inf``.

        Raises
        ------
        InvalidQueryError
            An id this worker holds already.
        """
        n = len(queries.ids)
        k = np.asarray(queries.k, dtype=np.int64).reshape(n)
        cap = k + self.state.settings.reserve
        start = np.cumsum(cap) - cap  # each new query's first place, relative
        top_d, top_h = np.full(int(cap.sum()), np.inf), np.full(int(cap.sum()), -1, dtype=np.int64)
        slots = self.state.queries.append(queries.ids, queries.lon, queries.lat, queries.keywords,
                                          [self.state.vocabulary.code_row(words) for words in queries.keywords], k,
                                          cap, np.full(n, np.inf))
        q, rank, d, oids, keys = kept_entries(topk, cap)
        if len(q):
            key_of = dict(zip(oids, keys.tolist()))  # (distinct ids, in first-seen order)
            distinct = list(key_of)
            distinct_keys = np.fromiter(key_of.values(), dtype=np.uint64, count=len(distinct))
            handle = dict(zip(distinct, self.state.handles.handles_in(distinct, objects, distinct_keys).tolist()))
            top_d[start[q] + rank] = d
            top_h[start[q] + rank] = np.fromiter(map(handle.__getitem__, oids), dtype=np.int64, count=len(oids))
        count = np.bincount(q, minlength=n).astype(np.int64)
        last = k if first_k else cap
        full = np.flatnonzero((count == last) & (last > 0))
        self.state.queries.set_radius(slots.start + full, top_d[start[full] + last[full] - 1])
        self.state.lists.append(cap, top_d, top_h, count)
        if self.state.details is not None and len(q):  # (the kept objects' handles are known: no lookup)
            self.state.details.keep(np.fromiter(handle.values(), dtype=np.int64, count=len(distinct)),
                                    texts_of(objects)(distinct))
        self.state.handles.key_new()
        self.state.handles.live = max(self.state.handles.live, len(self.state.handles))
        self.state.load.extend(slots.stop)
        return slots

    def load_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                     objects: Mapping[str, ObjectInfo], *, version: int = 0, write: bool = True,
                     details: bool = False, sets: Sequence[int] | None = None, chunk: int = 5000,
                     vocabulary: Mapping[str, int] | None = None, rebuild: bool = True,
                     first_k: bool = False) -> LoadResult:
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
        first_k
            Each list is a query's first ``k`` only, as Redis holds its result (a worker revived
            with a reserve, from Redis): its kNN radius is the ``k``-th distance
            (:meth:`_append`); the reserve refills with the query's next refill.

        Returns
        -------
        LoadResult
            Queries taken, index entries, seconds.
        """
        t0 = time.perf_counter()
        self.state.vocabulary.learn(vocabulary)
        slots = self.append(queries, topk, objects, first_k)
        first = slots.start
        none = np.empty(0, dtype=np.int64)
        if self.state.writer is not None and not write:  # Redis holds them: count their holders
            r_slot, r_h, _ = self.state.results_of(np.arange(slots.start, slots.stop))
            dets = self.state.held(r_slot, r_h, none, none, texts_of(objects if details else {}))
            if any(hs for hs, _ in dets.values()):  # (a reserve's objects beyond k are in no result)
                tag = self.state.next_tag()
                self.state.write_now(self.state.writer.apply, tag, self.state.writer.details_payload(tag, dets))
        if self.state.writer is not None and write:
            # With the write queue, Redis runs chunk i's script while this thread builds the
            # payload of chunk i + 1 (at most 2 chunks wait, to bound memory).
            queued: deque = deque()
            q = self.state.queries
            for s in range(slots.start, slots.stop, chunk):
                part = np.arange(s, min(s + chunk, slots.stop))
                fields = [q.fields(j) if sets is None else {**q.fields(j), "set": sets[j - first]}
                          for j in part.tolist()]
                tag = self.state.next_tag()
                r_slot, r_h, r_d = self.state.results_of(part)
                dets = self.state.held(r_slot, r_h, none, none, texts_of(objects))
                changes = BatchChanges(q.ids.names(part),
                                       np.bincount(r_slot - s, minlength=len(part)).tolist(),
                                       self.state.handles.names(r_h.tolist()), r_d.tolist(), [0] * len(part), [],
                                       objects, version, dets)
                payload = self.state.writer.whole_payload(changes, fields)
                if self.state.queue is None:
                    self.state.writer.apply(tag, payload)
                    continue
                queued.append(self.state.queue.submit(self.state.writer.apply, tag, payload))
                if len(queued) > 2:
                    queued.popleft().result()
            for f in queued:
                f.result()
        if rebuild:
            self.state.rebuild_index()
            give_back()  # the load's payloads
        return LoadResult(len(queries), self.state.index.entries, time.perf_counter() - t0)

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
        self.state.vocabulary.learn(vocabulary)
        slots = self.append(queries, topk, objects)
        if self.state.writer is not None:
            q, none = self.state.queries, np.empty(0, dtype=np.int64)
            r_slot, r_h, _ = self.state.results_of(np.arange(slots.start, slots.stop))
            dets = self.state.held(r_slot, r_h, none, none, texts_of(objects))
            rows = [(qid, q.fields(j), self.state.result_row(j)) for qid, j in zip(q.ids.names(slots), slots)]
            self.state.write_now(self.state.writer.write_queries, self.state.next_tag(), rows, objects, version, dets)
        self.state.refresh(np.arange(slots.start, slots.stop))

    def unregister_query(self, qid: str, version: int = 0) -> bool:
        """Remove a query and delete its Redis keys (its feed line at ``version``, as
        :meth:`register_queries`); ``False`` if this worker does not hold it."""
        slot = self.state.queries.slot(qid)
        if slot is None:
            return False
        if self.state.writer is not None:
            r_slot, r_h, _ = self.state.results_of(np.array([slot], dtype=np.int64))
            none = np.empty(0, dtype=np.int64)
            dets = self.state.held(none, none, r_slot, r_h, texts_of({}))
            self.state.write_now(self.state.writer.delete_query, self.state.next_tag(), qid, version,
                                 [oid for oid, _ in self.state.result_row(slot)], dets)
        self.drop([qid])
        return True

    def drop(self, qids: Sequence[str]) -> None:
        """Forget queries this worker holds (no Redis write): their slots die, their places and
        handles are released (compacting when enough are), the index forgets their regions."""
        if not len(qids):
            return
        slots = self.state.queries.drop(qids)
        self.state.lists.release(slots, self.state.queries.cap[slots])
        self.state.load.clear(slots)
        self.state.refresh(slots)
        if self.state.compact_due():
            self.compact()

    def compact(self) -> None:
        """Release what unregistered queries left: their slots (the live queries are
        renumbered), their top-k places, and the handles of objects no result holds; then
        rebuild the query index. O(sum of k + index entries)."""
        keep = np.flatnonzero(self.state.queries.alive)
        self.window.renumber(keep)
        self.state.lists.compact(keep, self.state.queries.cap[keep])
        self.state.queries.compact(keep)
        self.state.load.keep(keep)
        self.state.compact_handles()
        self.state.rebuild_index()
