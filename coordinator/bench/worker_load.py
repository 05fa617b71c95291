"""A worker's initial load built outside the runtime, for benchmarks that drive one
:class:`~knnmon.workers.worker.KnnWorker` directly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from knnmon.batch import ObjectInfo
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.coordinator.runtime.object_store import _info
from knnmon.query import QueryColumns

__all__ = ["initial_load"]


def initial_load(initial: pa.Table, queries: pa.Table, processes: int = 1
                 ) -> tuple[QueryColumns, list[list[tuple[str, float]]], dict[str, ObjectInfo]]:
    """The arguments of :meth:`KnnWorker.load_queries` for ``queries`` (``id``, ``lon``, ``lat``,
    ``keywords``, ``k``) over the ``initial`` objects (ingest columns, stream order): the query
    columns, each query's exact kNN as ``[(object id, distance m), ...]`` nearest first, and the
    details of every object in them.

    ``processes``: for the exact search (:meth:`ObjectIndex.knn_v`)."""
    index = ObjectIndex(initial)
    idx, counts, dist = index.knn_v(queries.column("lon").to_numpy(), queries.column("lat").to_numpy(),
                                    queries.column("keywords"), queries.column("k").to_numpy().astype(np.int64),
                                    processes=processes)
    ends = np.cumsum(counts)
    ids = index.ids[idx]
    topk = [list(zip(ids[e - c:e].tolist(), dist[e - c:e].tolist())) for e, c in zip(ends.tolist(), counts.tolist())]
    columns = QueryColumns(queries.column("id").to_pylist(), queries.column("lon").to_numpy(),
                           queries.column("lat").to_numpy(), queries.column("keywords").to_pylist(),
                           queries.column("k").to_numpy())
    return columns, topk, _info(initial, idx)
