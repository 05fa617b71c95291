"""A worker's settings, which the coordinator makes and checks before any worker starts (light:
no numpy, no compiled kernels), so that reading the settings does not load the worker."""

from __future__ import annotations

from dataclasses import dataclass

from knnmon.errors import InvalidArgumentError

__all__ = ["INDEX_NAMES", "ORPHAN_S", "WorkerSettings"]

#: The workers' query indexes (``workers.index``; the classes: :data:`knnmon.workers.state.INDEXES`).
INDEX_NAMES = ("grid", "rtree", "keyword-lists")

#: A detached worker actor exits when its service's heartbeat is older than this, seconds
#: (:mod:`knnmon.workers.actor`).
ORPHAN_S = 300.0


@dataclass(frozen=True)
class WorkerSettings:
    """The settings every worker of a run is made with (:class:`~knnmon.workers.worker.KnnWorker`).

    Attributes
    ----------
    redis_url
        Where results go; ``None`` keeps results in memory only (tests, dry runs).
    namespace
        Redis key prefix.
    index
        ``"grid"`` (the keyword-aware :class:`~knnmon.workers.query_index.QueryIndex`),
        ``"rtree"`` (the keyword-aware R-tree, :class:`~knnmon.workers.rtree_index.RTreeIndex`)
        or ``"keyword-lists"`` (the single-process reference's
        :class:`~knnmon.workers.keyword_lists.KeywordLists`).
    overlap_writes
        Write each batch's changes on a background thread while the next batch is computed; the
        caller then gets the write's figures from ``written``. Default: a batch's call returns
        after its write.
    reserve
        With a window: each query keeps this many neighbours beyond its ``k`` (its result is the
        first ``k``), so that an expiry takes the next one from the reserve instead of a refill
        search (Skype's k-skyband idea, VLDBJ 2017).
    track_load
        Charge each query its measured load per batch (:mod:`knnmon.workers.query_load`), for
        re-balancing; off, a batch pays nothing for it and every load reads 0.
    redis_wait_s
        Retry a Redis that does not answer this long before a write fails, seconds
        (:func:`~knnmon.connection.set_retry_window`, for the worker's process); ``None``: as set.

    Raises
    ------
    InvalidArgumentError
        An unknown ``index`` or a negative ``reserve``.
    """

    redis_url: str | None = None
    namespace: str = "knn"
    index: str = "grid"
    overlap_writes: bool = False
    reserve: int = 0
    track_load: bool = False
    redis_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.index not in INDEX_NAMES:
            raise InvalidArgumentError(f"Invalid index: {self.index!r}.\nValid options are: {INDEX_NAMES}")
        if self.reserve < 0:
            raise InvalidArgumentError(f"the reserve must be >= 0; got {self.reserve}")
