"""The worker: owns a share of the queries and keeps their kNN exact as object batches arrive.

A plain class (unit-testable without a cluster); :mod:`knnmon.workers.actor` wraps it as a Ray
actor at the edge. Per batch (``SPEC.md``, "The worker"; Tsuruoka et al. 2019, §4.4):

1. candidates: (object, query) pairs whose query region holds the object and shares a keyword,
   from :class:`~knnmon.workers.query_index.QueryIndex` (vectorised, no loop over objects);
2. exact haversine check against ``r_q`` (queries with fewer than ``k`` results pass always);
3. top-k update, ordered by ``(distance m, object id)``; ``r_q`` shrinks and the query is
   re-indexed with its smaller region (:meth:`QueryIndex.refresh`, O(entries), no re-sort);
4. every changed result, the objects now in results, and one ``changes`` entry per changed
   query written in one atomic, exactly-once script call
   (:class:`~knnmon.workers.result_writer.ResultWriter`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from knnmon.errors import InvalidQueryError
from knnmon.geo import haversine_m
from knnmon.workers.query_index import QueryIndex
from knnmon.workers.result_writer import Change, ObjectInfo, ResultWriter

__all__ = ["KnnWorker"]


class KnnWorker:
    """Exact kNN maintenance for a set of queries.

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
    """

    def __init__(self, worker_id: int, redis_url: str | None, namespace: str = "knn", *,
                 vocabulary: Mapping[str, int] | None = None) -> None:
        self.worker_id = worker_id
        self.writer = ResultWriter(redis_url, namespace, worker_id) if redis_url else None
        self.qids: list[str] = []
        self.slot_of: dict[str, int] = {}
        self.lon = np.empty(0)
        self.lat = np.empty(0)
        self.k = np.empty(0, dtype=np.int64)
        self.radius = np.empty(0)
        self.alive = np.empty(0, dtype=bool)
        self.version = np.empty(0, dtype=np.int64)
        self.topk: list[list[tuple[float, str]]] = []
        self.keywords: list[tuple[str, ...]] = []
        self.vocab: dict[str, int] = dict(vocabulary or {})
        self.index = QueryIndex()
        self._tag = 0
        self.refreshed = 0

    # -- queries -----------------------------------------------------------------------------
    def _codes(self, words: Sequence[str]) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in words]

    def _append(self, ids: Sequence[str], lon: Sequence[float], lat: Sequence[float], k: Sequence[int],
                keywords: Sequence[Sequence[str]], topk: Sequence[Sequence[tuple[str, float]]]) -> range:
        """Add queries in bulk (one array concatenation); returns their slots."""
        first = len(self.qids)
        radii = []
        for i, qid in enumerate(ids):
            qid, kk, words = str(qid), int(k[i]), tuple(keywords[i])
            if qid in self.slot_of:
                raise InvalidQueryError(f"worker {self.worker_id}: query {qid!r} is already registered")
            if kk < 1 or not words:
                raise InvalidQueryError(f"query {qid!r}: k must be >= 1 and it needs a keyword (k={kk}, {list(words)})")
            self.slot_of[qid] = len(self.qids)
            self.qids.append(qid)
            self.keywords.append(words)
            self._codes(words)
            lst = sorted((float(d), str(o)) for o, d in topk[i])[:kk]
            self.topk.append(lst)
            radii.append(lst[-1][0] if len(lst) == kk else np.inf)
        n = len(ids)
        self.lon = np.concatenate([self.lon, np.asarray(lon, dtype=np.float64)])
        self.lat = np.concatenate([self.lat, np.asarray(lat, dtype=np.float64)])
        self.k = np.concatenate([self.k, np.asarray(k, dtype=np.int64)])
        self.alive = np.concatenate([self.alive, np.ones(n, dtype=bool)])
        self.version = np.concatenate([self.version, np.zeros(n, dtype=np.int64)])
        self.radius = np.concatenate([self.radius, np.asarray(radii, dtype=np.float64)])
        return range(first, first + n)

    def _entries(self, slots: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        slot_list, code_list = [], []
        for s in slots:
            for c in self._codes(self.keywords[s]):
                slot_list.append(s)
                code_list.append(c)
        return np.asarray(slot_list, dtype=np.int64), np.asarray(code_list, dtype=np.int64)

    def rebuild_index(self) -> float:
        """Rebuild the query index from the current radii; returns seconds spent."""
        t0 = time.perf_counter()
        slot, code = self._entries(np.flatnonzero(self.alive).tolist())
        self.index.rebuild(slot, code, self.lon[slot], self.lat[slot], self.radius[slot])
        return time.perf_counter() - t0

    def _refresh(self, slots: Sequence[int]) -> None:
        """Re-index queries whose region changed (shrunk, new, removed)."""
        live = [s for s in slots if self.alive[s]]
        slot, code = self._entries(live)
        self.index.refresh(np.asarray(slots, dtype=np.int64), slot, code, self.lon[slot], self.lat[slot],
                           self.radius[slot])
        self.refreshed += len(slots)

    def _fields(self, slot: int) -> dict[str, Any]:
        return {"lon": repr(float(self.lon[slot])), "lat": repr(float(self.lat[slot])),
                "keywords": " ".join(self.keywords[slot]), "k": int(self.k[slot]), "version": int(self.version[slot])}

    def _next_tag(self) -> int:
        self._tag -= 1  # initial loads and registrations use negative tags, batches their number
        return self._tag

    def load_queries(self, ids: Sequence[str], lon: Sequence[float], lat: Sequence[float], k: Sequence[int],
                     keywords: Sequence[Sequence[str]], topk: Sequence[Sequence[tuple[str, float]]],
                     objects: Mapping[str, ObjectInfo], *, chunk: int = 5000) -> dict[str, Any]:
        """Take queries with their initial kNN (exact over the objects seen so far).

        Parameters
        ----------
        ids, lon, lat, k, keywords
            ``m`` queries (degrees; keywords normalised).
        topk
            ``m`` lists of ``(object id, distance m)``: each query's exact kNN so far.
        objects
            Details of every object in those lists (for ``knn:object:{oid}``).

        Returns
        -------
        dict
            ``queries``, ``index_entries``, ``seconds``.
        """
        t0 = time.perf_counter()
        slots = self._append(ids, lon, lat, k, keywords, topk)
        if self.writer is not None:
            for s in range(slots.start, slots.stop, chunk):
                rows = [(self.qids[j], self._fields(j), self._result(j)) for j in range(s, min(s + chunk, slots.stop))]
                self.writer.write_queries(self._next_tag(), rows, objects)
        self.rebuild_index()
        return {"queries": len(ids), "index_entries": self.index.entries, "seconds": time.perf_counter() - t0}

    def register_query(self, qid: str, lon: float, lat: float, keywords: Sequence[str], k: int,
                       topk: Sequence[tuple[str, float]], objects: Mapping[str, ObjectInfo],
                       vocabulary: Mapping[str, int] | None = None) -> None:
        """Add one query at run time with its initial kNN; it is a candidate from the next batch on.

        ``vocabulary`` gives the codes of its keywords when the coordinator encodes batches.

        Raises
        ------
        InvalidQueryError
            Duplicate id, ``k < 1`` or no keyword.
        """
        if vocabulary:
            self.vocab.update(vocabulary)
        slot = self._append([qid], [lon], [lat], [k], [list(keywords)], [topk])[0]
        if self.writer is not None:
            self.writer.write_queries(self._next_tag(), [(qid, self._fields(slot), self._result(slot))], objects)
        self._refresh([slot])

    def unregister_query(self, qid: str) -> bool:
        """Remove a query and delete its Redis keys; ``False`` if this worker does not hold it."""
        slot = self.slot_of.pop(qid, None)
        if slot is None:
            return False
        self.alive[slot] = False
        if self.writer is not None:
            self.writer.delete_query(self._next_tag(), qid)
        self.topk[slot] = []
        self._refresh([slot])
        return True

    def _result(self, slot: int) -> list[tuple[str, float]]:
        return [(o, d) for d, o in self.topk[slot]]

    def result(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` nearest first."""
        return self._result(self.slot_of[qid])

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

    def process_batch(self, batch: int, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, t: np.ndarray,
                      keywords: Sequence[Sequence[str]], pairs: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> dict[str, Any]:
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

        Returns
        -------
        dict
            ``worker``, ``batch``, ``objects``, ``candidates`` (pairs checked exactly),
            ``passed`` (pairs within ``r_q``), ``changed`` (results changed), ``busy_s``,
            ``redis_s``, ``index_s``.
        """
        t0 = time.perf_counter()
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        po, pc_ = pairs if pairs is not None else self.encode(keywords)
        obj, slot = self.index.candidates(lon, lat, po, pc_)
        n_candidates = len(obj)
        d = haversine_m(lon[obj], lat[obj], self.lon[slot], self.lat[slot])
        ok = (d <= self.radius[slot]) & self.alive[slot]
        obj, slot, d = obj[ok], slot[ok], d[ok]
        changes: list[Change] = []
        entered_objects: set[str] = set()
        changed_slots: list[int] = []
        if len(slot):
            order = np.lexsort((obj, d, slot))
            obj, slot, d = obj[order], slot[order], d[order]
            first = np.ones(len(slot), dtype=bool)  # a query sharing 2 keywords with an object: once
            first[1:] = (slot[1:] != slot[:-1]) | (obj[1:] != obj[:-1])
            obj, slot, d = obj[first], slot[first], d[first]
            # Only a query's k nearest new candidates can enter: keep those at most as far as the
            # k-th (ties at the k-th distance all stay, so ties by id are decided exactly below).
            start = np.searchsorted(slot, slot, side="left")
            count = np.searchsorted(slot, slot, side="right") - start
            kk = self.k[slot]
            kth = d[np.where(count >= kk, start + kk - 1, start + count - 1)]
            keep = d <= kth
            obj, slot, d = obj[keep].tolist(), slot[keep], d[keep].tolist()
            bounds = np.flatnonzero(np.diff(slot)).tolist()
            starts, ends = [0] + [b + 1 for b in bounds], [b + 1 for b in bounds] + [len(slot)]
            slot = slot.tolist()
            for a, b in zip(starts, ends):
                s = slot[a]
                old = self.topk[s]
                k = int(self.k[s])
                new = sorted(old + [(d[i], ids[obj[i]]) for i in range(a, b)])[:k]
                if new == old:
                    continue
                old_ids = {o for _, o in old}
                new_ids = {o for _, o in new}
                entered = [(o, dd) for dd, o in new if o not in old_ids]
                left = [o for _, o in old if o not in new_ids]
                self.topk[s] = new
                self.version[s] += 1
                if len(new) == k and new[-1][0] < self.radius[s]:
                    self.radius[s] = new[-1][0]
                    changed_slots.append(s)
                changes.append(Change(self.qids[s], int(self.version[s]), entered, left))
                entered_objects.update(o for o, _ in entered)
        busy_core = time.perf_counter() - t0
        t1 = time.perf_counter()
        if changes and self.writer is not None:
            pos = {o: j for j, o in enumerate(ids)}
            info = {o: ObjectInfo(float(lon[pos[o]]), float(lat[pos[o]]), int(t[pos[o]]), list(keywords[pos[o]]))
                    for o in entered_objects}
            self.writer.write_changes(batch, changes, info)
        redis_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        if changed_slots:
            self._refresh(changed_slots)
        index_s = time.perf_counter() - t2
        return {"worker": self.worker_id, "batch": batch, "objects": len(ids), "candidates": n_candidates,
                "passed": int(len(slot)), "changed": len(changes), "busy_s": busy_core + redis_s + index_s,
                "redis_s": redis_s, "index_s": index_s}

    def stats(self) -> dict[str, Any]:
        """Queries held, index entries, queries re-indexed so far, and this process's peak RSS (MB)."""
        import resource

        return {"worker": self.worker_id, "queries": int(self.alive.sum()), "index_entries": self.index.entries,
                "refreshed": self.refreshed, "keywords": len(self.vocab),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
