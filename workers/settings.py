"""A worker's settings, which the coordinator makes and checks before any worker starts (light:
no numpy, no compiled kernels), so that reading the settings does not load the worker."""

from __future__ import annotations

from dataclasses import dataclass

from knnmon.errors import InvalidArgumentError

__all__ = ["INDEX_NAMES", "MAX_RELEASE_GROUPS", "ORPHAN_S", "WorkerSettings"]

#: The workers' query indexes (``--index``; the classes: :data:`knnmon.workers.state.INDEXES`).
INDEX_NAMES = ("grid", "rtree", "keyword-lists")

#: At most this many parts per batch (:class:`~knnmon.workers.worker.KnnWorker`'s
#: ``release_groups``): each costs a script call.
MAX_RELEASE_GROUPS = 64

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
        ``"rtree"`` (the R-tree with BatchSearch, :class:`~knnmon.workers.rtree_index.RTreeIndex`)
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
    release_groups
        Release a batch's changes in up to this many parts, objects in Short-Job-First order
        (Wang, Zhang and Kitsuregawa: the cheap objects' changes do not wait for the expensive
        ones; :mod:`~knnmon.workers.release_parts`). 1: one write per batch. Not with
        ``overlap_writes``.
    redis_wait_s
        Retry a Redis that does not answer this long before a write fails, seconds
        (:func:`~knnmon.connection.set_retry_window`, for the worker's process); ``None``: as set.

    Raises
    ------
    InvalidArgumentError
        An unknown ``index``, a negative ``reserve``, ``release_groups`` outside
        ``1..MAX_RELEASE_GROUPS``, or above 1 with ``overlap_writes``.
    """

    redis_url: str | None = None
    namespace: str = "knn"
    index: str = "grid"
    overlap_writes: bool = False
    reserve: int = 0
    track_load: bool = False
    release_groups: int = 1
    redis_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.index not in INDEX_NAMES:
            raise InvalidArgumentError(f"Invalid index: {self.index!r}.\nValid options are: {INDEX_NAMES}")
        if self.reserve < 0:
            raise InvalidArgumentError(f"the reserve must be >= 0; got {self.reserve}")
        if not 1 <= self.release_groups <= MAX_RELEASE_GROUPS:
            raise InvalidArgumentError(f"--release-groups must be in 1..{MAX_RELEASE_GROUPS}; "
                                       f"got {self.release_groups}")
        if self.release_groups > 1 and self.overlap_writes:
            raise InvalidArgumentError("--release-groups above 1 needs synchronous writes (--sync-writes): a part is "
                                       "released when its write is in Redis")
