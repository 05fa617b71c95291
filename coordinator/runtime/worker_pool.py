"""The workers of a run, in process or as Ray actors, called the same way.

:func:`make_pool` starts ``W`` :class:`~knnmon.workers.worker.KnnWorker` s either as plain objects
in the coordinator's process (:class:`InlinePool`: one process, no serialisation; tests and the
fastest setting on one core) or as Ray actors (:class:`~knnmon.coordinator.runtime.ray_pool.RayPool`: one process each, on the nodes
of a Ray cluster). Callers send with the typed calls of :class:`WorkerPool` (``process``,
``load``, ``expire``, ..., one per :class:`~knnmon.workers.interface.WorkerApi` method) and wait
with :meth:`WorkerPool.gather`; a worker that died surfaces as :class:`~knnmon.errors.WorkerLostError`
naming it (the ``ActorPool`` pattern of Ray's ``util/actor_pool.py``).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa

from knnmon.batch import ObjectBatch, ObjectInfo, QueryHandover
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.errors import WorkerLostError
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.reports import KeptReport, LoadResult, WorkerReport, WorkerStats, WriteFigures
from knnmon.workers.interface import WorkerApi
from knnmon.workers.settings import WorkerSettings

__all__ = ["InlinePool", "Pending", "WorkerPool", "make_pool"]

log = logging.getLogger("knnmon.runtime")



T = TypeVar("T")


@dataclass(frozen=True)
class Pending(Generic[T]):
    """A call sent to worker ``worker`` whose result is a ``T`` (:meth:`WorkerPool.gather`
    gives it): ``handle`` is the result itself (in process), or its Ray object ref."""

    worker: int
    handle: object


class WorkerPool(ABC):
    """``size`` workers; ``call`` sends, ``gather`` waits (module docstring)."""

    #: The workers run in the caller's thread: a call returns once its work is done.
    inline: bool = False
    #: A lost worker can be made anew (:meth:`replace`) and rebuilt in place
    #: (:mod:`~knnmon.coordinator.recovery.revival`).
    revivable: bool = True

    def __init__(self, size: int) -> None:
        self.size = size
        #: What each actor taken from the service before said of its state
        #: (:meth:`~knnmon.workers.actor.WorkerHost.kept_for`), until kept or reset (a RayPool's).
        self.kept: dict[int, KeptReport] = {}

    @abstractmethod
    def call(self, worker: int, method: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        """Send ``method(*args, **kwargs)`` (a :class:`~knnmon.workers.interface.WorkerApi`
        method) to worker ``worker``, in order with its earlier calls."""

    def gather(self, pending: Sequence[Pending[T]]) -> list[T]:
        """The results of ``pending``, in order.

        Raises
        ------
        WorkerLostError
            A worker died (its actor process was killed, or its node was lost): the first, in
            call order.
        """
        out = self.gather_each(pending)
        lost = next((x for x in out if isinstance(x, WorkerLostError)), None)
        if lost is not None:
            raise lost
        return out

    @abstractmethod
    def gather_each(self, pending: Sequence[Pending[T]]) -> list[T | WorkerLostError]:
        """As :meth:`gather`, but a lost worker's result is its :class:`WorkerLostError` (not
        raised): the others' results are kept."""

    def ready(self, pending: Sequence[Pending[Any]]) -> bool:
        """Whether every call of ``pending`` returned (or failed): :meth:`gather` would not wait."""
        return True

    # The worker's calls, typed (:class:`~knnmon.workers.interface.WorkerApi`; each returns a
    # :class:`Pending` for :meth:`gather`).
    def process(self, worker: int, batch: ObjectBatch, rows: np.ndarray | None, *, cutoff: int | None = None,
                refills: Refills | None = None) -> Pending[WorkerReport]:
        """:meth:`KnnWorker.process_rows`: a shared batch's rows for ``worker`` (``None``: those
        its bitmasks give it, :meth:`ObjectBatch.rows_of`). Arguments left at their defaults are
        not sent: each one adds to the call's cost in the dispatching thread."""
        options = {k: v for k, v in (("cutoff", cutoff), ("refills", refills)) if v is not None}
        return self.call(worker, WorkerApi.process_rows, batch, *(() if rows is None else (rows,)), **options)

    def written(self, worker: int, batch: int) -> Pending[WriteFigures]:
        """:meth:`KnnWorker.written`: the queued write of ``batch``."""
        return self.call(worker, WorkerApi.written, batch)

    def last_write(self, worker: int) -> Pending[tuple[str | None, bool]]:
        """:meth:`KnnWorker.last_write`: its last write's marker, and whether a write failed since."""
        return self.call(worker, WorkerApi.last_write)

    def expire(self, worker: int, cutoff: int) -> Pending[QueryColumns]:
        """:meth:`KnnWorker.expire`: the queries to refill."""
        return self.call(worker, WorkerApi.expire, cutoff)

    def load(self, worker: int, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
             objects: Mapping[str, ObjectInfo], **options: Any) -> Pending[LoadResult]:
        """:meth:`KnnWorker.load_queries` (its keyword options as given)."""
        return self.call(worker, WorkerApi.load_queries, queries, topk, objects, **options)

    def register(self, worker: int, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                 objects: Mapping[str, ObjectInfo], *, vocabulary: Mapping[str, int] | None = None,
                 version: int = 0) -> Pending[None]:
        """:meth:`KnnWorker.register_queries`."""
        return self.call(worker, WorkerApi.register_queries, queries, topk, objects, vocabulary=vocabulary,
                          version=version)

    def unregister(self, worker: int, qid: str, version: int = 0) -> Pending[bool]:
        """:meth:`KnnWorker.unregister_query`: ``True`` if ``worker`` held ``qid``."""
        return self.call(worker, WorkerApi.unregister_query, qid, version)

    def result(self, worker: int, qid: str) -> Pending[list[tuple[str, float]]]:
        """:meth:`KnnWorker.result`."""
        return self.call(worker, WorkerApi.result, qid)

    def regions(self, worker: int) -> Pending[tuple[pa.Table, np.ndarray]]:
        """:meth:`KnnWorker.regions`: its queries and their kNN radii."""
        return self.call(worker, WorkerApi.regions)

    def stats(self, worker: int) -> Pending[WorkerStats]:
        """:meth:`KnnWorker.stats`."""
        return self.call(worker, WorkerApi.stats)

    def query_loads(self, worker: int) -> Pending[tuple[list[str], np.ndarray, np.ndarray, np.ndarray]]:
        """:meth:`KnnWorker.query_loads`: each query's recent measured load."""
        return self.call(worker, WorkerApi.query_loads)

    def export(self, worker: int, qids: Sequence[str]) -> Pending[QueryHandover]:
        """:meth:`KnnWorker.export_queries`: hand queries over (the worker forgets them)."""
        return self.call(worker, WorkerApi.export_queries, qids)

    def adopt(self, worker: int, handover: QueryHandover, vocabulary: Mapping[str, int] | None = None,
              note: Mapping[str, str] | None = None) -> Pending[tuple[int, float]]:
        """:meth:`KnnWorker.adopt_queries`."""
        return self.call(worker, WorkerApi.adopt_queries, handover, vocabulary, note)

    def export_parts(self, worker: int, parts: Sequence[Sequence[str]]) -> list[Pending[QueryHandover]]:
        """:meth:`KnnWorker.export_parts`: one export, one result per part (Ray: an object ref each)."""
        if len(parts) == 1:
            return [self.export(worker, parts[0])]
        return self._call_parts(worker, WorkerApi.export_parts, len(parts), [list(p) for p in parts])

    def _call_parts(self, worker: int, method: Callable[..., tuple[T, ...]], n: int, *args: Any) -> list[Pending[T]]:
        """``method(*args)``, whose result is a tuple of ``n``, as ``n`` pending results."""
        return [Pending(worker, v) for v in self.gather([self.call(worker, method, *args)])[0]]

    def release_handed(self, worker: int) -> Pending[int]:
        """:meth:`KnnWorker.release_handed`."""
        return self.call(worker, WorkerApi.release_handed)

    def regions_with(self, worker: int, keywords: Sequence[str]) -> Pending[tuple[np.ndarray, ...]]:
        """:meth:`KnnWorker.regions_with`: its queries holding any of ``keywords``, with their radii."""
        return self.call(worker, WorkerApi.regions_with, list(keywords))

    def kept_queries(self, worker: int) -> Pending[tuple[QueryColumns, np.ndarray, np.ndarray, dict[str, int]]]:
        """:meth:`KnnWorker.kept_queries`: its queries, radii, result sizes and keyword codes."""
        return self.call(worker, WorkerApi.kept_queries)

    def holds_among(self, worker: int, oids: Sequence[str]) -> Pending[list[str]]:
        """:meth:`KnnWorker.holds_among`: the ids among ``oids`` its lists hold."""
        return self.call(worker, WorkerApi.holds_among, oids)

    def keep_for(self, worker: int) -> Pending[int]:
        """:meth:`KnnWorker.keep_for`: a kept worker becomes this service's."""
        return self.call(worker, WorkerApi.keep_for)

    def reset_taken(self) -> None:
        """Make the workers taken from the service before empty (:attr:`kept`; none but in a
        :class:`RayPool` with ``detach_as``)."""
        self.kept = {}

    def share(self, obj: Any) -> Any:
        """``obj`` as the workers receive it without one copy each (Ray's object store)."""
        return obj

    @abstractmethod
    def replace(self, worker: int) -> None:
        """Start worker ``worker`` anew, empty, with the pool's settings; the caller loads its
        queries (a revival)."""

    @abstractmethod
    def close(self) -> None:
        """Stop the workers."""


class InlinePool(WorkerPool):
    """Workers as plain objects in this process (``executor="inline"``).

    A worker is lost when one of its calls raises :class:`~knnmon.errors.WorkerLostError` or
    :meth:`kill` is called (what tests use to lose a worker in process): its calls then fail as
    a dead Ray actor's do, until :meth:`replace` makes it anew with ``make``.
    """

    inline = True

    def __init__(self, workers: Sequence[Any], make: Callable[[int], Any] | None = None) -> None:
        super().__init__(len(workers))
        self.workers = list(workers)
        self._make = make
        #: The workers lost and not yet replaced.
        self.lost: set[int] = set()

    @property
    def revivable(self) -> bool:
        return self._make is not None

    def call(self, worker: int, method: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        if worker in self.lost:
            return Pending(worker, WorkerLostError(worker, "its in-process worker was lost"))
        try:
            return Pending(worker, getattr(self.workers[worker], method.__name__)(*args, **kwargs))
        except WorkerLostError as ex:
            self.lost.add(worker)
            return Pending(worker, ex)

    def gather_each(self, pending: Sequence[Pending[T]]) -> list[T | WorkerLostError]:
        return [p.handle for p in pending]  # type: ignore[misc]  (in process: the result itself)

    def kill(self, worker: int) -> None:
        """Lose worker ``worker``: its state is gone and its calls fail until :meth:`replace`."""
        self.lost.add(worker)

    def replace(self, worker: int) -> None:
        """Make worker ``worker`` anew, empty (as :meth:`RayPool.replace`); the caller loads its
        queries."""
        self.workers[worker] = self._make(worker)
        self.lost.discard(worker)

    def close(self) -> None:
        self.workers = []


def make_pool(config: RunConfig, redis_url: str | None, *, detach: bool = False) -> WorkerPool:
    """``config.workers`` workers writing to ``redis_url`` under ``config.store.namespace``, in
    process or as Ray actors (``config.executor``). A worker starts without keyword codes: each
    load, registration and hand-over brings the codes of its queries' keywords (the routing
    table's), so a worker holds only its own.

    ``detach``: on a Ray cluster that outlives this process (``ray_address`` or ``RAY_ADDRESS``
    given), start the actors detached and take those a service before left in this namespace
    of this Redis (:mod:`knnmon.workers.actor`; ``knnmon serve``, whose heartbeat they watch),
    and keep a spare actor started for revivals (:meth:`RayPool.replace`)."""
    from knnmon.workers.worker import KnnWorker

    settings = WorkerSettings(redis_url=redis_url, namespace=config.store.namespace, index=config.index,
                              overlap_writes=config.overlap_writes, reserve=config.places_reserved,
                              track_load=config.rebalance is not None, redis_wait_s=config.redis_wait_s)
    if config.executor == "inline":
        return InlinePool([KnnWorker(w, settings) for w in range(config.workers)],
                          make=lambda w: KnnWorker(w, settings))
    detach_as = None
    if detach and redis_url and (config.ray_address or os.environ.get("RAY_ADDRESS")):
        import hashlib

        from knnmon.connection import redact

        where = f"{redact(redis_url)}|{config.store.namespace}".encode("utf-8", "surrogateescape")
        detach_as = f"knnmon-{hashlib.sha1(where).hexdigest()[:12]}"
    from knnmon.coordinator.runtime.ray_pool import RayPool

    return RayPool(config.workers, settings, config.ray_address, detach_as, spare=detach_as is not None)
