"""Every object seen so far, for the exact initial kNN of queries registered at run time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.batch import ObjectInfo

__all__ = ["ObjectStore"]

#: The streamed objects are folded into the main index once they exceed this many and this
#: share of it (a rebuild then costs about a second per million objects, at a registration).
FOLD_MIN, FOLD_SHARE = 50_000, 0.05


class ObjectStore:
    """The objects seen so far: a main :class:`ObjectIndex` plus the streamed tail.

    Appending is O(1) per batch. A kNN search asks the main index and a small index over the
    tail (built on demand, cached until the next append) and merges by (distance, id). When
    the tail grows past ``FOLD_MIN`` objects and ``FOLD_SHARE`` of the main index, the next
    search folds it into the main index first.

    Parameters
    ----------
    initial
        Table ``id``, ``lon``, ``lat``, ``t``, ``keywords`` (may be empty).
    index
        An :class:`ObjectIndex` over ``initial`` if one exists already.
    """

    def __init__(self, initial: pa.Table, index: ObjectIndex | None = None) -> None:
        self.initial = initial
        self._main = initial
        self.index = index if index is not None else ObjectIndex(initial)
        self._batches: list[pa.Table] = []
        self._tail: tuple[pa.Table, ObjectIndex] | None = None

    def __len__(self) -> int:
        return self._main.num_rows + sum(b.num_rows for b in self._batches)

    def append(self, batch: pa.Table) -> None:
        """Add streamed objects (same columns as ``initial``)."""
        self._batches.append(batch.select(self._main.column_names).cast(self._main.schema))
        self._tail = None

    def initial_info(self, rows: np.ndarray) -> dict[str, ObjectInfo]:
        """:class:`ObjectInfo` of initial objects by row (for ``knn:object:{oid}``)."""
        return _info(self.initial, rows)

    def _tail_index(self) -> tuple[pa.Table, ObjectIndex] | None:
        if not self._batches:
            return None
        n = sum(b.num_rows for b in self._batches)
        if n >= FOLD_MIN and n >= FOLD_SHARE * self._main.num_rows:
            self._main = pa.concat_tables([self._main, *self._batches]).combine_chunks()
            self.index = ObjectIndex(self._main)
            self._batches, self._tail = [], None
            return None
        if self._tail is None:
            tail = pa.concat_tables(self._batches).combine_chunks()
            self._batches = [tail]
            self._tail = (tail, ObjectIndex(tail))
        return self._tail

    def knn_v(self, lon: Sequence[float], lat: Sequence[float], keywords: Sequence[Sequence[str]],
              k: Sequence[int]) -> tuple[list[list[tuple[str, float]]], dict[str, ObjectInfo]]:
        """Exact kNN of ``m`` queries over every object seen.

        Parameters
        ----------
        lon, lat
            ``(m,)`` degrees. ``keywords``: ``m`` lists of keywords; ``k``: ``(m,)`` ints >= 1.

        Returns
        -------
        topk
            Per query ``[(object id, distance m), ...]`` nearest first, ties by id.
        info
            Details of every object in those lists.
        """
        lon, lat = np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)
        k = np.asarray(k, dtype=np.int64)
        tail = self._tail_index()
        parts = [(self._main, self.index)] + ([tail] if tail is not None else [])
        found: list[list[tuple[float, str, int, int]]] = [[] for _ in range(len(lon))]
        for p, (table, index) in enumerate(parts):
            if not len(index):
                continue
            idx, counts, dist = index.knn_v(lon, lat, [list(w) for w in keywords], k)
            q = np.repeat(np.arange(len(lon)), counts)
            for qi, i, d in zip(q.tolist(), idx.tolist(), dist.tolist()):
                found[qi].append((d, str(index.ids[i]), p, i))
        topk, rows = [], [[] for _ in parts]
        for qi, cands in enumerate(found):
            best = sorted(cands)[:int(k[qi])]
            topk.append([(oid, d) for d, oid, _, _ in best])
            for _, _, p, i in best:
                rows[p].append(i)
        info: dict[str, ObjectInfo] = {}
        for (table, _), r in zip(parts, rows):
            info.update(_info(table, np.asarray(r, dtype=np.int64)))
        return topk, info

    def knn(self, lon: float, lat: float, keywords: Sequence[str], k: int) -> tuple[list[tuple[str, float]],
                                                                                    dict[str, ObjectInfo]]:
        """Exact kNN of one query over every object seen: ``[(object id, distance m), ...]`` and
        the objects' details."""
        topk, info = self.knn_v([lon], [lat], [list(keywords)], [k])
        return topk[0], info


def _info(table: pa.Table, rows: np.ndarray) -> dict[str, ObjectInfo]:
    """:class:`ObjectInfo` of ``table``'s rows, by object id."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    if not len(rows):
        return {}
    part = table.take(pa.array(rows)).to_pydict()
    return {str(oid): ObjectInfo(float(x), float(y), int(t), kws)
            for oid, x, y, t, kws in zip(part["id"], part["lon"], part["lat"], part["t"], part["keywords"])}
