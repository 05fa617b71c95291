"""A query workload prepared for assignment: locations, kNN radii, cell rectangles and loads."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from knnmon.arrays import runs
from knnmon.costs import CostModel
from knnmon.assignment.loadmodel import LoadModel, QueryRects
from knnmon.errors import InvalidArgumentError

__all__ = ["Workload"]


@dataclass(frozen=True)
class Workload:
    """Queries as arrays, with each (query, keyword) *entry* and its load ``P(R_q, key)``.

    Attributes
    ----------
    ids : ``(m,)`` object (str)
    lon, lat : ``(m,)`` float64 degrees
    k : ``(m,)`` int32
    radius_m : ``(m,)`` float64 meters, the kNN radius ``r_q`` (``inf``: fewer than ``k`` objects)
    rects : :class:`QueryRects`, ``R_q`` per query
    ptr : ``(m + 1,)`` int64; the entries of query ``i`` are ``ptr[i]:ptr[i+1]``
    code : ``(e,)`` int64 keyword code per entry, into ``vocabulary``
    vocabulary : list of str, the model's keywords followed by query keywords absent from the
        statistics (codes ``>= len(model.keywords)``: probability 0, load 0, but routed)
    entry_p : ``(e,)`` float64, ``P(R_q, key)``
    entry_load : ``(e,)`` float64, the entry's share of its query's cost (``P(R_q, key)`` under
        the paper's model; see :mod:`knnmon.costs`)
    load : ``(m,)`` float64, the query's cost: ``L(q)`` (formula (8)) under the paper's model
    """

    ids: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    k: np.ndarray
    radius_m: np.ndarray
    rects: QueryRects
    ptr: np.ndarray
    code: np.ndarray
    entry_load: np.ndarray
    load: np.ndarray
    vocabulary: list[str]
    entry_p: np.ndarray

    @classmethod
    def build(cls, model: LoadModel, queries: pa.Table, radius_m: np.ndarray, *, costs: CostModel | None = None,
              change_rate: np.ndarray | None = None) -> Workload:
        """Prepare ``queries`` (the query file's columns) with their kNN radii.

        ``costs`` (default: the paper's model) weighs ``L(q)`` and ``change_rate`` (``(m,)``
        expected result changes per arriving object, ``count_q / N0``; required when
        ``costs.change`` is not 0) into each query's cost (:mod:`knnmon.costs`).

        Raises
        ------
        InvalidArgumentError
            No queries, or ``radius_m`` / ``change_rate`` not of the same length.
        """
        m = queries.num_rows
        if m == 0:
            raise InvalidArgumentError("the query file holds no queries")
        radius_m = np.asarray(radius_m, dtype=np.float64)
        if radius_m.shape != (m,):
            raise InvalidArgumentError(f"expected {m} kNN radii, got shape {radius_m.shape}")
        lon = queries.column("lon").to_numpy()
        lat = queries.column("lat").to_numpy()
        rects = model.rects(lon, lat, radius_m)
        keywords = queries.column("keywords").combine_chunks()
        owner, code = model.encode(keywords)
        vocabulary = list(model.keywords)
        unknown = np.flatnonzero(code < 0)
        if len(unknown):
            words = keywords.flatten().take(pa.array(unknown)).to_pylist()
            extra = sorted(set(words))
            vocabulary += extra
            base = len(model.keywords)
            code[unknown] = base + np.searchsorted(np.array(extra, dtype=object), np.array(words, dtype=object))
        order = np.argsort(owner, kind="stable")
        owner, code = owner[order], code[order]
        ptr = np.searchsorted(owner, np.arange(m + 1)).astype(np.int64)
        entry_p = model.entry_loads(owner, code, rects)
        costs = costs or CostModel.named("paper")
        entry_load = costs.candidate * entry_p
        if costs.change:
            rate = np.asarray(change_rate, dtype=np.float64) if change_rate is not None else None
            if rate is None or rate.shape != (m,):
                raise InvalidArgumentError(f"the {costs.name!r} cost model needs {m} change rates")
            entry_load = entry_load + costs.change * (rate / np.diff(ptr))[owner]  # split over the entries
        load = np.bincount(owner, weights=entry_load, minlength=m)
        return cls(np.asarray(queries.column("id").to_pylist(), dtype=object), lon, lat,
                   queries.column("k").to_numpy().astype(np.int32), radius_m, rects, ptr, code, entry_load, load,
                   vocabulary, entry_p)

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def owner(self) -> np.ndarray:
        """``(e,)`` int64: the query of each entry."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.ptr))

    def entries(self, queries: np.ndarray) -> np.ndarray:
        """Entry indices of ``queries`` (``(q,)`` int), query by query."""
        queries = np.asarray(queries, dtype=np.int64)
        lens = self.ptr[queries + 1] - self.ptr[queries]
        return runs(self.ptr[queries], lens)

    def deliveries(self, model: LoadModel, queries: np.ndarray) -> float:
        """``D(S)`` of the set of ``queries`` (see :mod:`knnmon.assignment.loadmodel`)."""
        e = self.entries(queries)
        return model.deliveries(self.owner[e], self.code[e], self.rects)
