"""The objects a query registered at run time (or a result refilled after an expiry) is searched
over: every object seen, or with a window only the live ones."""

from __future__ import annotations

from collections.abc import Sequence
import numpy as np
import pyarrow as pa

from knnmon.arrays import runs
from knnmon.coordinator.runtime.nearest_first import nearest_first
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.coordinator.runtime.window_parts import FIT_BEFORE_SEARCHES, Compactor, Part
from knnmon.batch import KnnColumns, ObjectColumns

__all__ = ["ObjectStore"]

#: The columns of an object's details (what a worker writes to its details hash).
_DETAILS = ["id", "lon", "lat", "t", "keywords"]

#: The streamed objects are folded into the main index once they exceed this many and this
#: share of it (a rebuild then costs about a second per million objects, at a registration).
FOLD_MIN, FOLD_SHARE = 50_000, 0.05

#: With a window, the streamed tail becomes a part of its own at this many objects
#: (:mod:`~knnmon.coordinator.runtime.window_parts` merges and rebuilds the parts).
SEAL = 10_000

#: A candidate's object as ``part << _PART_SHIFT | row`` (a part holds fewer than 2^32 objects).
_PART_SHIFT, _ROW_MASK = 32, (1 << 32) - 1


class ObjectStore:
    """The objects seen so far, or a window's live objects, for exact kNN searches.

    Without a window: a main :class:`ObjectIndex` plus the streamed tail. Appending is O(1)
    per batch. A kNN search asks the main index and a small index over the tail (built on
    demand, cached until the next append) and merges by (distance, id). When the tail grows
    past ``FOLD_MIN`` objects and ``FOLD_SHARE`` of the main index, the next search folds it
    into the main index first.

    With a window (:meth:`expire`): parts in arrival order, each with its own index. The tail
    becomes a part at :data:`SEAL` objects, and neighbouring parts of one size merge as in a
    size-tiered LSM tree, so there are O(log(live / SEAL)) parts. An expiry drops the parts with
    no live object left and marks the expired objects of the others (searches skip them); a part
    is rebuilt once fewer than half of it are live: the memory and the search time follow the
    live objects, not history. Merges, rebuilds and the parts' box fits run on threads of their
    own (:mod:`~knnmon.coordinator.runtime.window_parts`): no search waits for one.

    Parameters
    ----------
    initial
        Table ``id``, ``lon``, ``lat``, ``t``, ``keywords`` (may be empty).
    index
        An :class:`ObjectIndex` over ``initial`` if one exists already.
    background
        With a window, merge and rebuild parts on a thread of their own (default); ``False``:
        at once, as the search or expiry that finds them due (tests).
    """

    def __init__(self, initial: pa.Table, index: ObjectIndex | None = None, *, background: bool = True) -> None:
        # One chunk per column: a take from a table of several chunks concatenates them first
        # (26 ms for 1 M objects in 9 chunks, at every refill and every part of a load).
        initial = initial.combine_chunks()
        #: The objects the store started with (counted; their details read by :meth:`initial_info`
        #: until the stream starts: then the parts alone hold them, dropped as they expire).
        self.initial_objects = initial.num_rows
        self._initial: pa.Table | None = initial
        self._parts: list[Part] = [Part.of(initial, index)]
        self._batches: list[pa.Table] = []
        self._tail: tuple[pa.Table, ObjectIndex] | None = None
        self._windowed = False
        self._cutoff: int | None = None
        self.compactor = Compactor(background)

    @property
    def index(self) -> ObjectIndex:
        """The index of the oldest part (all objects but the tail, without a window)."""
        return self._parts[0].index

    @property
    def _main(self) -> pa.Table:
        return self._parts[0].table

    def __len__(self) -> int:
        """Objects held: every one seen, or with a window, the live ones."""
        return sum(p.live for p in self._parts) + sum(b.num_rows for b in self._batches)

    def append(self, batch: pa.Table) -> None:
        """Add streamed objects (same columns as ``initial``)."""
        self._batches.append(batch.select(self._main.column_names).cast(self._main.schema))
        self._tail, self._initial = None, None

    def expire(self, cutoff: int) -> None:
        """Forget the objects with ``t <= cutoff`` (epoch ms): a window's expired objects."""
        self._windowed, self._cutoff = True, cutoff
        parts = [p.expire(cutoff) for p in self._parts]
        self._parts = [p for p in parts if p is not None] or [Part.of(self._main.slice(0, 0))]
        self._parts = self.compactor.poll(self._parts, cutoff)
        self.compactor.plan(self._parts)
        self.compactor.fit(self._parts)
        kept = []
        for b in self._batches:
            t = b.column("t").to_numpy()
            if len(t) and t.max() > cutoff:
                kept.append(b if t.min() > cutoff else b.filter(pa.array(t > cutoff)))
        if len(kept) != len(self._batches) or any(a is not b for a, b in zip(kept, self._batches)):
            self._batches, self._tail = kept, None

    def initial_info(self, rows: np.ndarray) -> ObjectColumns:
        """The details of initial objects by row (for the workers' details hashes), in columns
        (each :class:`ObjectInfo` made when it is looked up).

        Raises
        ------
        RuntimeError
            The stream has started (the initial objects are no longer kept apart).
        """
        if self._initial is None:
            raise RuntimeError("the initial objects' details are read before the stream starts")
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        return ObjectColumns.of_table(self._initial.take(pa.array(rows, type=pa.int64())))

    def _seal(self) -> None:
        """With a window: the tail becomes a part (merged later: :class:`Compactor`)."""
        self._parts.append(Part.of(pa.concat_tables(self._batches).combine_chunks()))
        self._batches, self._tail = [], None
        if not self._parts[0].table.num_rows and len(self._parts) > 1:
            self._parts.pop(0)
        self.compactor.plan(self._parts)

    def close(self) -> None:
        """Stop the compactor's thread."""
        self.compactor.close()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tail_index(self) -> tuple[pa.Table, ObjectIndex] | None:
        if not self._batches:
            return None
        n = sum(b.num_rows for b in self._batches)
        if self._windowed and n >= SEAL:
            self._seal()
            return None
        if not self._windowed and n >= FOLD_MIN and n >= FOLD_SHARE * self._main.num_rows:
            self._parts = [Part.of(pa.concat_tables([self._main, *self._batches]).combine_chunks())]
            self._batches, self._tail = [], None
            return None
        if self._tail is None:
            tail = pa.concat_tables(self._batches).combine_chunks()
            self._batches = [tail]
            self._tail = (tail, ObjectIndex(tail))
        return self._tail

    def knn_v(self, lon: Sequence[float], lat: Sequence[float], keywords: Sequence[Sequence[str]],
              k: Sequence[int], exclude: frozenset[str] = frozenset()) -> tuple[KnnColumns, ObjectColumns]:
        """:meth:`_knn_v`, leaving out the objects ``exclude`` (ids): each query searched again
        with as many more neighbours as it lost to them, until none is short (a few queries,
        a revived worker's refills); each entry keeps its row in the details (``topk.rows``)."""
        k = np.asarray(k, dtype=np.int64)
        extra, gone = np.zeros(len(k), dtype=np.int64), np.asarray(sorted(exclude), dtype=object)
        while True:
            topk, info = self._knn_v(lon, lat, keywords, k + extra)
            if not exclude:
                return topk, info
            q = np.repeat(np.arange(len(k)), topk.counts)
            out = np.isin(topk.ids, gone)
            lost = np.bincount(q[out], minlength=len(k))
            short = (topk.counts - lost < k) & (topk.counts == k + extra)  # (all searched were found)
            if not short.any():
                break
            extra[short] = lost[short]
        at = np.flatnonzero(~out)
        at = at[np.arange(len(at)) - np.searchsorted(q[at], q[at]) < k[q[at]]]  # (each list's first k kept)
        return KnnColumns(np.bincount(q[at], minlength=len(k)), topk.ids[at], topk.dist[at], topk.rows[at]), info

    def _knn_v(self, lon: Sequence[float], lat: Sequence[float], keywords: Sequence[Sequence[str]],
               k: Sequence[int]) -> tuple[KnnColumns, ObjectColumns]:
        """Exact kNN of ``m`` queries over every object seen (with a window: every live one).

        Parameters
        ----------
        lon, lat
            ``(m,)`` degrees. ``keywords``: ``m`` lists of keywords, or a pyarrow list<string>
            array of ``m``; ``k``: ``(m,)`` ints >= 1.

        Returns
        -------
        topk
            Per query its list nearest first, ties by id (a list of ``(object id, distance m)``
            where one is read), with each entry's row in ``info`` (``topk.rows``).
        info
            Details of every object in those lists, in columns.

        The parts are searched largest first, each within the ``k``-th distance found in the
        parts before it (nothing farther can be among a query's nearest), so that the smaller
        parts cost little.
        """
        lon, lat = np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)
        k = np.asarray(k, dtype=np.int64)
        m = len(lon)
        if self._windowed:
            self._parts = self.compactor.poll(self._parts, self._cutoff)
            if m >= FIT_BEFORE_SEARCHES:  # (a refill wave: its region's space out of the boxes first)
                for part in self._parts:
                    part.fit()
        tail = self._tail_index()
        parts = [(p.table, p.index, p.alive, p.live) for p in self._parts]
        parts += [(*tail, None, len(tail[1]))] if tail is not None else []
        parts.sort(key=lambda x: -x[3])
        words = keywords if isinstance(keywords, (pa.Array, pa.ChunkedArray)) else \
            pa.array([list(w) for w in keywords], type=pa.list_(pa.string()))
        Q, D, K, O = [np.empty(0, np.int64)], [np.empty(0)], [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
        bound = np.full(m, np.inf)
        for p, (_, index, alive, _) in enumerate(parts):
            if not len(index):
                continue
            idx, counts, dist = index.knn_v(lon, lat, words, k, alive=alive, bound_m=bound)
            full = np.flatnonzero(counts >= k)  # this part's k-th distance bounds the next parts
            bound[full] = np.minimum(bound[full], dist[(np.cumsum(counts) - counts + k - 1)[full]])
            Q.append(np.repeat(np.arange(m), counts))
            D.append(dist)
            K.append(index.id_keys[idx])
            O.append((p << _PART_SHIFT) | idx)
        Q, D, K, O = (np.concatenate(x) for x in (Q, D, K, O))
        # One ranking for every part: by query, distance, then id (prefix keys; equal ones by the ids).
        take, counts, tied = nearest_first(Q, D, K, O, k)
        if tied.any():
            take = self._settle_ties(parts, take, counts, np.flatnonzero(tied), Q, D, O, k)
        P, I = O[take] >> _PART_SHIFT, O[take] & _ROW_MASK
        ids, rows = _ids_of(parts, O[take]), np.empty(len(take), dtype=np.int64)
        tables, offset = [], 0
        for p, (table, _, _, _) in enumerate(parts):
            sel = np.flatnonzero(P == p)
            if not len(sel):
                continue
            held = np.unique(I[sel])
            rows[sel] = offset + np.searchsorted(held, I[sel])
            tables.append(table.take(pa.array(held, type=pa.int64())).select(_DETAILS))
            offset += len(held)
        info = ObjectColumns.of_table(pa.concat_tables(tables).combine_chunks()) if tables else \
            ObjectColumns.of_infos({})
        return KnnColumns(counts, ids, D[take], rows), info

    @staticmethod
    def _settle_ties(parts: list, take: np.ndarray, counts: np.ndarray, tied: np.ndarray, Q: np.ndarray,
                     D: np.ndarray, O: np.ndarray, k: np.ndarray) -> np.ndarray:
        """``take`` with the lists of the queries ``tied`` (equal distances and id prefix keys
        among their first ``k + 1``) ranked again by the ids themselves (no object is in two
        parts, so their counts stay)."""
        cand = np.flatnonzero(np.isin(Q, tied))
        order = np.lexsort((_ids_of(parts, O[cand]).astype(str), D[cand], Q[cand]))
        cand = cand[order]
        q = Q[cand]
        rank = np.arange(len(cand)) - np.searchsorted(q, q, side="left")
        cand = cand[rank < k[q]]
        ends = np.cumsum(counts)
        take = take.copy()
        take[runs(ends[tied] - counts[tied], counts[tied])] = cand
        return take

    def knn(self, lon: float, lat: float, keywords: Sequence[str], k: int) -> tuple[list[tuple[str, float]],
                                                                                    ObjectColumns]:
        """Exact kNN of one query over every object seen: ``[(object id, distance m), ...]`` and
        the objects' details."""
        topk, info = self.knn_v([lon], [lat], [list(keywords)], [k])
        return topk[0], info


def _ids_of(parts: list, objects: np.ndarray) -> np.ndarray:
    """The ids (an object array) of ``objects`` (``part << _PART_SHIFT | row``, int64) of
    ``parts`` (``(table, index, alive, live)`` as :meth:`ObjectStore._knn_v` lists them)."""
    ids, part = np.empty(len(objects), dtype=object), objects >> _PART_SHIFT
    for p in np.unique(part).tolist():
        sel = part == p
        ids[sel] = parts[p][1].ids[objects[sel] & _ROW_MASK]
    return ids
