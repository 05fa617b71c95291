"""A worker's queries as columns, one row per slot: location, keywords, ``k``, kNN radius.

A slot is a query's row number; a dropped query's slot dies (``alive`` false, its ``reach``
``-1`` so the kernels' pre-test passes nothing) until :meth:`QueryTable.compact` renumbers the
live ones. Keywords are kept as codes in CSR form (``kw_ptr``, ``kw_code``), what the query index
is built from, and as text for the queries' hashes and hand-over. The ids and the keywords' texts
are columns of bytes (:mod:`knnmon.id_table`), the ids found by hash: no Python object per query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.arrays import runs
from knnmon.errors import InvalidQueryError
from knnmon.geo import chord2_bound, unit_vectors
from knnmon.id_table import IdTable, StringColumn
from knnmon.query import QueryColumns

__all__ = ["QueryTable"]


class QueryTable:
    """The query columns (module docstring).

    ``ids`` (:class:`~knnmon.id_table.IdTable`: slot -> id, and :meth:`slots` of ids); per
    slot ``lon``, ``lat`` (float64 degrees), ``k``, ``cap`` (int64: ``k`` + reserve, the places kept), ``radius`` (float64
    meters: ``r_q``, ``inf`` below ``cap`` entries), ``reach`` (``(Q, 4)`` float64: unit vector
    and :func:`~knnmon.geo.chord2_bound` of ``r_q``, ``-1`` once dropped), ``alive`` (bool),
    ``keywords`` (:class:`~knnmon.id_table.StringColumn`, space separated), ``kw_ptr`` /
    ``kw_code`` (int64 CSR of keyword codes).
    """

    def __init__(self) -> None:
        self.ids = IdTable()
        self.lon = np.empty(0)
        self.lat = np.empty(0)
        self.k = np.empty(0, dtype=np.int64)
        self.cap = np.empty(0, dtype=np.int64)
        self.radius = np.empty(0)
        self.reach = np.empty((0, 4))
        self.alive = np.empty(0, dtype=bool)
        self.keywords = StringColumn()
        self.kw_ptr = np.zeros(1, dtype=np.int64)
        self.kw_code = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def slots(self, qids: Sequence[str]) -> np.ndarray:
        """``(m,)`` int64: the live slot of each id, ``-1`` for one this table does not hold."""
        return self.ids.lookup(qids)

    def live_ids(self) -> list[str]:
        """The ids of the live slots, in slot order."""
        return self.ids.names(np.flatnonzero(self.alive))

    def slot(self, qid: str) -> int | None:
        """The live slot of ``qid``, ``None`` if this table does not hold it."""
        return self.ids.get(qid)

    def append(self, ids: Sequence[str], lon: np.ndarray, lat: np.ndarray, keywords: Sequence[Sequence[str]],
               codes: Sequence[Sequence[int]], k: np.ndarray, cap: np.ndarray, radius: np.ndarray) -> range:
        """Add ``n`` queries (their keyword ``codes`` given); returns their slots.

        Raises
        ------
        InvalidQueryError
            An id this table holds already (nothing is added).
        """
        first, n = len(self.ids), len(ids)
        ids = [str(q) for q in ids]
        held = self.ids.lookup(ids)
        if (held >= 0).any() or len(set(ids)) < n:
            dup = [q for q, h in zip(ids, held.tolist()) if h >= 0] or ids
            raise InvalidQueryError(f"query {dup[0]!r} is already registered")
        self.ids.add(ids)
        self.keywords.append([" ".join(words) for words in keywords])
        n_codes = np.cumsum([len(c) for c in codes], dtype=np.int64)
        self.kw_ptr = np.concatenate([self.kw_ptr, self.kw_ptr[-1] + n_codes])
        self.kw_code = np.concatenate([self.kw_code, np.fromiter((c for row in codes for c in row), dtype=np.int64)])
        lon, lat = np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)
        self.lon = np.concatenate([self.lon, lon])
        self.lat = np.concatenate([self.lat, lat])
        self.k = np.concatenate([self.k, k])
        self.cap = np.concatenate([self.cap, cap])
        self.alive = np.concatenate([self.alive, np.ones(n, dtype=bool)])
        self.radius = np.concatenate([self.radius, radius])
        self.reach = np.concatenate([self.reach, np.column_stack([unit_vectors(lon, lat), chord2_bound(radius)])])
        return range(first, first + n)

    def entries(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slot, keyword code)`` int64 index entries of ``slots`` (one per query keyword)."""
        slots = np.asarray(slots, dtype=np.int64)
        a = self.kw_ptr[slots]
        n = self.kw_ptr[slots + 1] - a
        return np.repeat(slots, n), self.kw_code[runs(a, n)]

    def set_radius(self, slots: np.ndarray, radius: np.ndarray) -> None:
        """``r_q`` of ``slots`` becomes ``radius`` (meters), with its pre-test bound."""
        self.radius[slots] = radius
        self.reach[slots, 3] = chord2_bound(radius)

    def drop(self, qids: Sequence[str]) -> np.ndarray:
        """Kill the slots of ``qids`` (held ones); returns them.

        Raises
        ------
        KeyError
            An id this table does not hold (nothing is dropped).
        """
        slots = self.ids.lookup(qids)
        if (slots < 0).any():
            raise KeyError(list(qids)[int(np.argmin(slots))])
        self.ids.forget(slots)
        self.alive[slots] = False
        self.reach[slots, 3] = -1.0
        return slots

    def compact(self, keep: np.ndarray) -> None:
        """Keep the rows ``keep`` (sorted live slots) only, renumbered ``0..len(keep)-1``."""
        n_kw = self.kw_ptr[keep + 1] - self.kw_ptr[keep]
        self.kw_code = self.kw_code[runs(self.kw_ptr[keep], n_kw)]
        self.kw_ptr = np.concatenate([[0], np.cumsum(n_kw)]).astype(np.int64)
        for name in ("lon", "lat", "k", "cap", "radius", "reach"):
            setattr(self, name, getattr(self, name)[keep])
        self.alive = np.ones(len(keep), dtype=bool)
        self.ids.keep(keep)
        self.keywords.keep(keep)

    def fields(self, slot: int) -> dict[str, object]:
        """The query hash's fields of ``slot`` (``knn:query:{qid}``)."""
        return {"lon": repr(float(self.lon[slot])), "lat": repr(float(self.lat[slot])),
                "keywords": self.keywords[slot], "k": int(self.k[slot])}

    def same(self, slots: np.ndarray, queries: QueryColumns) -> np.ndarray:
        """``(m,)`` bool: whether each live slot of ``slots`` holds ``queries[j]`` as it is now
        (location, keywords in order, ``k`` the places it keeps: ``cap``). A query re-registered
        with other parameters has a slot of its own under the same id."""
        slots = np.asarray(slots, dtype=np.int64)
        same = (np.asarray(queries.lon, dtype=np.float64) == self.lon[slots]) & \
            (np.asarray(queries.lat, dtype=np.float64) == self.lat[slots]) & \
            (np.asarray(queries.k, dtype=np.int64) == self.cap[slots])
        held = self.keywords.names(slots)
        return same & np.fromiter((" ".join(w) == h for w, h in zip(queries.keywords, held)), dtype=bool,
                                  count=len(slots))

    def table(self, slots: np.ndarray) -> pa.Table:
        """The query file's columns of ``slots`` (``id``, ``lon``, ``lat``, ``keywords``, ``k``:
        :meth:`~knnmon.query.QueryColumns.to_table`'s schema), in Arrow from the columns'
        buffers: no Python object per query."""
        rows = pa.array(np.asarray(slots, dtype=np.int64))
        words = pc.split_pattern(self.keywords.arrow().take(rows), " ")
        return pa.table({"id": self.ids.arrow().take(rows).cast(pa.string()), "lon": self.lon[slots],
                         "lat": self.lat[slots], "keywords": words.cast(pa.list_(pa.string())),
                         "k": pa.array(self.k[slots], pa.int32())})

    def columns(self, slots: np.ndarray, k: np.ndarray | None = None) -> QueryColumns:
        """:class:`QueryColumns` of ``slots`` (``k`` instead of their own if given)."""
        return QueryColumns(self.ids.names(slots), self.lon[slots].copy(), self.lat[slots].copy(),
                            [w.split() for w in self.keywords.names(slots)], (self.k if k is None else k)[slots].copy())
