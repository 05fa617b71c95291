"""Shared set-up of the one-worker benchmarks (``worker_breakdown.py``, ``script_replay.py``):
one :class:`KnnWorker` holds every query, with its exact initial kNN over the first
``--initial`` objects, and is fed the next ``--batches`` batches of ``--batch`` objects."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.query import QueryColumns
from knnmon.workers.worker import KnnWorker


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--objects DIR --queries FILE [--initial N] [--batches M] [--batch B]``."""
    p.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    p.add_argument("--queries", required=True, metavar="FILE", help="a query file")
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--batch", type=int, default=1000)


@dataclass
class Workload:
    """The queries with their initial kNN (``topk``: per query ``[(object id, meters)]``;
    ``info``: the details of those objects) and the stream that follows."""

    queries: pa.Table
    topk: list[list[tuple[str, float]]]
    info: dict[str, Any]
    stream: pa.Table
    batch: int

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> Workload:
        objects = stream_order(read_objects(a.objects), None)
        q = pq.read_table(a.queries)
        init, stream = objects.slice(0, a.initial), objects.slice(a.initial, a.batches * a.batch)
        index = ObjectIndex(init)
        idx, counts, dist = index.knn_v(q.column("lon").to_numpy(), q.column("lat").to_numpy(), q.column("keywords"),
                                        q.column("k").to_numpy(), processes=2)
        ends = np.cumsum(counts)
        topk = [[(index.ids[idx[j]], dist[j]) for j in range(e - c, e)] for e, c in zip(ends, counts)]
        return cls(q, topk, ObjectStore(init, index).initial_info(idx), stream, a.batch)

    def load(self, w: KnnWorker) -> None:
        """Hand ``w`` every query with its initial kNN."""
        q = self.queries
        w.load_queries(QueryColumns(q.column("id").to_pylist(), q.column("lon").to_numpy(), q.column("lat").to_numpy(),
                                    q.column("keywords").to_pylist(), q.column("k").to_numpy()), self.topk, self.info)

    def batches(self) -> Iterator[tuple]:
        """:meth:`KnnWorker.process_batch` arguments of each batch."""
        s = self.stream
        ids, kws = s.column("id").to_pylist(), s.column("keywords").to_pylist()
        lon, lat, t = s.column("lon").to_numpy(), s.column("lat").to_numpy(), s.column("t").to_numpy()
        for b in range(0, len(ids), self.batch):
            r = slice(b, b + self.batch)
            yield b // self.batch, ids[r], lon[r], lat[r], t[r], kws[r]
