"""What a worker answers, typed: the calls the coordinator's worker pools send.

:class:`WorkerApi` is a ``Protocol`` that :class:`~knnmon.workers.worker.KnnWorker` satisfies;
the pools (:mod:`knnmon.coordinator.runtime.worker_pool`) send each call by its method here
(``pool.process(w, batch, rows)``, not a method name as a string), in process or to a Ray actor
wrapping a ``KnnWorker``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from knnmon.batch import ObjectBatch, ObjectInfo, QueryHandover
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.reports import LoadResult, WorkerReport, WorkerStats, WriteFigures

__all__ = ["WorkerApi"]


@runtime_checkable
class WorkerApi(Protocol):
    """The calls a worker answers (each documented on :class:`~knnmon.workers.worker.KnnWorker`)."""

    def process_rows(self, batch: ObjectBatch, rows: np.ndarray | None = None, *, cutoff: int | None = None,
                     refills: Refills | None = None) -> WorkerReport: ...

    def written(self, batch: int) -> WriteFigures: ...

    def last_write(self) -> tuple[str | None, bool]: ...

    def expire(self, cutoff: int) -> QueryColumns: ...

    def load_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                     objects: Mapping[str, ObjectInfo], **options: Any) -> LoadResult: ...

    def register_queries(self, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                         objects: Mapping[str, ObjectInfo], vocabulary: Mapping[str, int] | None = None,
                         version: int = 0) -> None: ...

    def unregister_query(self, qid: str, version: int = 0) -> bool: ...

    def result(self, qid: str) -> list[tuple[str, float]]: ...

    def regions(self) -> tuple[pa.Table, np.ndarray]: ...

    def stats(self) -> WorkerStats: ...

    def query_loads(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]: ...

    def export_queries(self, qids: Sequence[str]) -> QueryHandover: ...

    def export_parts(self, parts: Sequence[Sequence[str]]) -> tuple[QueryHandover, ...]: ...

    def adopt_queries(self, handover: QueryHandover, vocabulary: Mapping[str, int] | None = None,
                      note: Mapping[str, str] | None = None) -> tuple[int, float]: ...

    def release_handed(self) -> int: ...

    def regions_with(self, keywords: Sequence[str]) -> tuple[np.ndarray, ...]: ...

    def kept_queries(self) -> tuple[QueryColumns, np.ndarray, np.ndarray, dict[str, int]]: ...

    def holds_among(self, oids: Sequence[str]) -> list[str]: ...

    def keep_for(self) -> int: ...
