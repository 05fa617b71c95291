"""Preparing a run: the objects in stream order, split into initial and streamed, and the exact
initial kNN of every query over the initial objects (whose k-th distances are the kNN radii the
plan balances). Benchmarks prepare once and run many plans on the result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS, RunConfig
from knnmon.arrays import runs
from knnmon.batch import KnnColumns
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.ingest.reading import OBJECT_COLUMNS, load_queries, read_objects, stream_head, stream_order
from knnmon.errors import InvalidArgumentError
from knnmon.limits import Limits
from knnmon.window import check_no_future, live_mask

__all__ = ["Prepared", "check_objects_in_bounds", "live_initial", "prepare", "prepare_tables", "with_arrival_times"]


@dataclass
class Prepared:
    """What every run over the same objects, queries and split shares (:func:`prepare`).

    ``initial`` and ``stream`` are tables in stream order; ``idx``, ``counts``, ``dist`` are the
    initial kNN as :meth:`ObjectIndex.knn_v` returns it (rows into ``initial``, per-query counts,
    meters), ``radius`` each query's k-th distance (``inf`` below ``k`` matches), ``timings``
    seconds spent reading and searching; ``first_batch`` the stream batches applied before (a
    service resuming continues the change feed's versions from there; else 0); ``placed``: each
    query's placement as Redis held it (a service resuming,
    :func:`~knnmon.workers.placements.placement_of`: the load rewrites only those the plan
    moves). Prepared with a ``reserve``
    (:func:`prepare_tables`): each query's ``k + reserve`` nearest and the last one's distance
    instead (its result: the first ``k``).
    """

    model: Any
    queries: pa.Table
    initial: pa.Table
    stream: pa.Table
    index: ObjectIndex | None
    idx: np.ndarray
    counts: np.ndarray
    dist: np.ndarray
    radius: np.ndarray
    timings: dict[str, float]
    first_batch: int = 0
    placed: dict[str, tuple] | None = None

    def __post_init__(self) -> None:
        self._ends = np.cumsum(self.counts)
        self._ids = self.index.ids if self.index is not None else np.empty(0, dtype=object)

    def knn_rows(self, q: int) -> np.ndarray:
        """``(c,)`` int64: rows of ``initial`` in query ``q``'s initial kNN, nearest first."""
        end = int(self._ends[q])
        return self.idx[end - int(self.counts[q]):end]

    def knn(self, q: int) -> list[tuple[str, float]]:
        """Query ``q``'s initial kNN: ``[(object id, distance m), ...]`` nearest first, ties by id."""
        return self.knn_lists([q])[0]

    def knn_lists(self, qs: Sequence[int]) -> KnnColumns:
        """:meth:`knn` of each query of ``qs``, in columns, the ids read in one take."""
        qs = np.asarray(qs, dtype=np.int64)
        counts = self.counts[qs]
        at = runs(self._ends[qs] - counts, counts)
        return KnnColumns(counts, self._ids[self.idx[at]].tolist(), self.dist[at])


def prepare(objects_dir: str, queries: str | pa.Table, config: RunConfig) -> Prepared:
    """Read the objects in stream order, split initial/stream, and compute the exact initial kNN.

    Raises
    ------
    InvalidArgumentError
        A missing or invalid ingest directory or query file, or an object whose ``t`` leads the
        wall clock by more than ``config.limits.max_future_ms`` (``knnmon run``'s arrival time
        is the wall clock: :func:`~knnmon.window.check_no_future`).
    """
    from knnmon.assignment import LoadModel

    c = config
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model = LoadModel.from_ingest(objects_dir)
    queries = queries if isinstance(queries, pa.Table) else load_queries(queries, c.limits)
    if c.batches is not None and c.shuffle is None:  # a bounded stream: read only the objects it uses
        objects = stream_head(objects_dir, c.initial + c.batches * c.batch, OBJECT_COLUMNS)
    else:
        objects = stream_order(read_objects(objects_dir, OBJECT_COLUMNS), c.shuffle)
    if c.arrival_ms is not None:
        objects = with_arrival_times(objects, c.arrival_ms)
    check_objects_in_bounds(objects, c.limits)
    initial = objects.slice(0, min(c.initial, objects.num_rows))
    rest = objects.slice(initial.num_rows)
    if c.window is not None:
        initial = live_initial(initial, c.window, c.allowed_lateness)
    if c.batches is not None:
        rest = rest.slice(0, c.batches * c.batch)
    timings["read_s"] = time.perf_counter() - t0

    return prepare_tables(model, queries, initial, rest, processes=c.processes, timings=timings,
                          reserve=c.places_reserved)


def with_arrival_times(objects: pa.Table, arrival_ms: int) -> pa.Table:
    """``objects`` (in stream order) with ``t`` replaced by arrival times: row ``i`` gets
    ``ARRIVAL_EPOCH_MS + i * arrival_ms`` epoch ms (``RunConfig.arrival_ms``)."""
    t = ARRIVAL_EPOCH_MS + np.arange(objects.num_rows, dtype=np.int64) * int(arrival_ms)
    return objects.set_column(objects.column_names.index("t"), "t", pa.array(t, type=pa.int64()))


def live_initial(initial: pa.Table, window_ms: int, lateness_ms: int = 0) -> pa.Table:
    """The initial objects still live at their own watermark (the largest ``t`` minus
    ``lateness_ms``) with a window of ``window_ms``: a run with a window starts from these
    (``docs/concepts.md``, "Semantics"; :func:`~knnmon.window.live_mask`)."""
    if not initial.num_rows:
        return initial
    return initial.filter(pa.array(live_mask(initial.column("t").to_numpy(), window_ms, lateness_ms)))


def check_objects_in_bounds(objects: pa.Table, limits: Limits, what: str = "the stream") -> None:
    """Refuse a table of objects (``id``, ``t``, ``keywords``) read from an ingest output that
    holds one outside the bounds every entry point applies (:mod:`knnmon.limits`): more than
    ``limits.max_keywords`` keywords, or a ``t`` that leads the wall clock by more than
    ``limits.max_future_ms`` (:func:`~knnmon.window.check_no_future`). ``knnmon ingest`` keeps no
    such object under the default bounds; tighter ones, or an older output, may hold some.

    Raises
    ------
    InvalidArgumentError
        Naming the first such object and the bound.
    """
    if not objects.num_rows:
        return
    n_kw = pc.list_value_length(objects.column("keywords")).to_numpy(zero_copy_only=False)
    over = np.flatnonzero(n_kw > limits.max_keywords)
    if len(over):
        i = int(over[0])
        raise InvalidArgumentError(
            f"{what}: {len(over):,} objects have more than {limits.max_keywords} keywords (too_many_keywords; "
            f"the first, {objects.column('id')[i].as_py()!r}, has {int(n_kw[i])}): ingest them again with these "
            "bounds, or raise limits.max_keywords")
    if limits.max_future_ms is None:
        return
    t, now = objects.column("t").to_numpy(), int(time.time() * 1000)
    if int(t.max()) - now <= limits.max_future_ms:
        return  # the common case: no id column read
    check_no_future(objects.column("id").to_pylist(), t, now, limits.max_future_ms, what)


def prepare_tables(model: Any, queries: pa.Table, initial: pa.Table, stream: pa.Table, *, processes: int = 2,
                   timings: dict[str, float] | None = None, reserve: int = 0) -> Prepared:
    """:class:`Prepared` from tables already in memory: the exact kNN of ``queries`` (``id``,
    ``lon``, ``lat``, ``keywords``, ``k``; may be empty) over ``initial`` (``id``, ``lon``,
    ``lat``, ``t``, ``keywords``; may be empty), with ``stream`` still to come."""
    timings = dict(timings or {})
    t0 = time.perf_counter()
    index = ObjectIndex(initial) if initial.num_rows else None
    lon, lat = queries.column("lon").to_numpy(), queries.column("lat").to_numpy()
    k = queries.column("k").to_numpy().astype(np.int64) + int(reserve)  # with a reserve, k + reserve
    if index is not None and len(lon):
        idx, counts, dist = index.knn_v(lon, lat, queries.column("keywords"), k, processes=processes)
        index.drop_trees()  # built for the initial kNN; a registration builds its own
    else:
        idx, counts, dist = np.empty(0, np.int64), np.zeros(len(lon), np.int64), np.empty(0)
    ends = np.cumsum(counts)
    radius = np.full(len(lon), np.inf)
    full = counts >= k
    radius[full] = dist[ends[full] - 1]
    timings["initial_knn_s"] = time.perf_counter() - t0
    return Prepared(model, queries, initial, stream, index, idx, counts, dist, radius, timings)
