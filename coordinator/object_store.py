"""Every object seen so far, for the exact initial kNN of queries registered at run time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.geo import haversine_m
from knnmon.workers.object_index import ObjectIndex
from knnmon.workers.result_writer import ObjectInfo

__all__ = ["ObjectStore"]


class ObjectStore:
    """The initial objects (indexed, :class:`ObjectIndex`) plus the streamed ones (appended).

    Parameters
    ----------
    initial
        Table ``id``, ``lon``, ``lat``, ``t``, ``keywords``.
    index
        An :class:`ObjectIndex` over ``initial`` if one exists already.
    """

    def __init__(self, initial: pa.Table, index: ObjectIndex | None = None) -> None:
        self.initial = initial
        self.index = index if index is not None else ObjectIndex(initial)
        self._t = initial.column("t").to_numpy() if initial.num_rows else np.empty(0, dtype=np.int64)
        self._batches: list[pa.Table] = []
        self._streamed: pa.Table | None = None

    def __len__(self) -> int:
        return self.initial.num_rows + sum(b.num_rows for b in self._batches)

    def append(self, batch: pa.Table) -> None:
        """Add streamed objects (same columns as ``initial``)."""
        self._batches.append(batch)
        self._streamed = None

    def initial_info(self, rows: np.ndarray) -> dict[str, ObjectInfo]:
        """:class:`ObjectInfo` of initial objects by row (for ``knn:object:{oid}``)."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        kws = self.initial.column("keywords").take(pa.array(rows)).to_pylist()
        ids, lon, lat, t = self.index.ids[rows], self.index.lon[rows], self.index.lat[rows], self._t[rows]
        return {str(ids[i]): ObjectInfo(float(lon[i]), float(lat[i]), int(t[i]), kws[i]) for i in range(len(rows))}

    def knn(self, lon: float, lat: float, keywords: Sequence[str], k: int) -> tuple[list[tuple[str, float]],
                                                                                    dict[str, ObjectInfo]]:
        """Exact kNN over every object seen: ``[(object id, distance m), ...]`` and their details."""
        idx, counts, dist = self.index.knn_v([lon], [lat], [list(keywords)], [k])
        found = [(float(d), str(self.index.ids[i])) for i, d in zip(idx, dist)]
        info = self.initial_info(idx)
        if self._batches:
            if self._streamed is None:
                self._streamed = pa.concat_tables(self._batches).combine_chunks()
                self._batches = [self._streamed]
            s = self._streamed
            kw = s.column("keywords").combine_chunks()
            hit = pc.is_in(kw.flatten(), value_set=pa.array(list(keywords), type=pa.string())).to_numpy(
                zero_copy_only=False)
            rows = np.unique(pc.list_parent_indices(kw).to_numpy()[hit])
            if len(rows):
                d = haversine_m(lon, lat, s.column("lon").to_numpy()[rows], s.column("lat").to_numpy()[rows])
                ids = s.column("id").to_numpy(zero_copy_only=False)[rows]
                best = sorted(zip(d.tolist(), ids.tolist()))[:k]
                found += best
                for _, oid in best:
                    r = rows[int(np.flatnonzero(ids == oid)[0])]
                    info[oid] = ObjectInfo(float(s.column("lon")[int(r)].as_py()), float(s.column("lat")[int(r)].as_py()),
                                           int(s.column("t")[int(r)].as_py()), s.column("keywords")[int(r)].as_py())
        top = sorted(found)[:k]
        return [(o, d) for d, o in top], {o: info[o] for _, o in top}
