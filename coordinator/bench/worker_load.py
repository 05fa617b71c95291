"""A worker's initial load built outside the runtime, for benchmarks that drive one
:class:`~knnmon.workers.worker.KnnWorker` directly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from knnmon.batch import KnnColumns, ObjectColumns
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.query import QueryColumns

__all__ = ["initial_load"]


def initial_load(initial: pa.Table, queries: pa.Table, processes: int = 1
                 ) -> tuple[QueryColumns, KnnColumns, ObjectColumns]:
    """The arguments of :meth:`KnnWorker.load_queries` for ``queries`` (``id``, ``lon``, ``lat``,
    ``keywords``, ``k``) over the ``initial`` objects (ingest columns, stream order): the query
    columns, each query's exact kNN nearest first, and the details of every object in them, in
    columns (as the runtime sends them).

    ``processes``: for the exact search (:meth:`ObjectIndex.knn_v`)."""
    index = ObjectIndex(initial)
    idx, counts, dist = index.knn_v(queries.column("lon").to_numpy(), queries.column("lat").to_numpy(),
                                    queries.column("keywords"), queries.column("k").to_numpy().astype(np.int64),
                                    processes=processes)
    topk = KnnColumns(counts, index.ids[idx].tolist(), dist)
    columns = QueryColumns(queries.column("id").to_pylist(), queries.column("lon").to_numpy(),
                           queries.column("lat").to_numpy(), queries.column("keywords").to_pylist(),
                           queries.column("k").to_numpy())
    rows = np.unique(idx)
    return columns, topk, ObjectColumns.of_table(initial.take(pa.array(rows, type=pa.int64())))
