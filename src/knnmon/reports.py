"""What a worker measures and reports, typed (:mod:`knnmon.batch` has what travels to it).

- :class:`WorkerReport` and :class:`WriteFigures`: what a worker measured on a batch;
- :class:`LoadResult`: a worker's load of queries;
- :class:`WorkerStats`: a worker's state and process (``KnnWorker.stats``);
- :class:`KeptReport`: whether a worker's state may be kept by the next service.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from knnmon.query import QueryColumns
from knnmon.refills import DueLists

__all__ = ["KeptReport", "LoadResult", "WorkerReport", "WorkerStats", "WriteFigures"]


@dataclass(frozen=True)
class LoadResult:
    """A worker's load of queries: ``queries`` taken, ``index_entries`` in its query index
    after it, ``seconds`` (wall) it took."""

    queries: int
    index_entries: int
    seconds: float


@dataclass(frozen=True)
class WorkerStats:
    """A worker's state and process, as :meth:`KnnWorker.stats` reports it.

    Attributes
    ----------
    worker, pid : int
        The worker's id and its process id.
    node : str or None
        The Ray node it runs on (``None`` outside Ray).
    queries, index_entries, refreshed, keywords : int
        Queries held, query index entries, queries re-indexed so far, keywords it has codes of.
    expired, refilled : int
        With a window: list entries expired and results refilled so far.
    peak_rss_mb : float
        The process's peak resident set size (MB).
    rss_mb, rss_anon_mb : float or None
        Its current resident set size and anonymous part (MB; ``None`` without ``/proc``).
    """

    worker: int
    node: str | None
    pid: int
    queries: int
    expired: int
    refilled: int
    index_entries: int
    refreshed: int
    keywords: int
    peak_rss_mb: float
    rss_mb: float | None
    rss_anon_mb: float | None


@dataclass(frozen=True)
class KeptReport:
    """Whether a worker's state equals what Redis holds, for a kept start
    (:mod:`~knnmon.coordinator.recovery.kept_start`; ``KnnWorker.kept_state``).

    Attributes
    ----------
    marker : str or None
        The value its last successful write left in Redis (``None``: none).
    why : str or None
        Why its state may differ from Redis's even if the marker matches (``None``: it does not).
    queries, pid, worker : int
        Queries held, its process id, its worker number.
    writes : bool
        ``False``: an empty spare without a Redis writer.
    """

    marker: str | None
    why: str | None
    queries: int
    pid: int
    worker: int
    writes: bool


@dataclass(frozen=True)
class WriteFigures:
    """One batch's Redis write, measured by the writing thread: ``redis_s`` (wall seconds of the
    script call), ``redis_server_s`` (the server's seconds running it), ``writer_cpu_s`` (the
    writing thread's CPU seconds, building and sending the payload). All 0: nothing written."""

    redis_s: float = 0.0
    redis_server_s: float = 0.0
    writer_cpu_s: float = 0.0


@dataclass(frozen=True)
class WorkerReport:
    """What one worker measured on one batch.

    Attributes
    ----------
    worker, batch : int
    objects : int
        Objects delivered to this worker.
    candidates, passed, changed : int
        (object, query) pairs checked exactly; pairs within ``r_q``; results changed.
    busy_s : float
        Wall seconds from call to return.
    cpu_s : float
        The worker's CPU seconds plus the Redis server's seconds on its writes: the busy time
        on a dedicated core, which CPU contention on a machine with fewer cores than workers
        does not inflate.
    redis_s, redis_server_s, index_s : float
        Wall seconds writing, the server's seconds running the script, seconds re-indexing.
    write_queued : bool
        The write went to the worker's write queue: ``redis_s`` and ``redis_server_s`` are 0
        here and come with :meth:`with_write`.
    refilled : int
        Results refilled after a window's expiry (:class:`~knnmon.refills.Refills`).
    index_merges, handle_compactions : int
        The query index's full merges (its ``compactions``) and the object handles'
        compactions during the batch: a worker's one-off steps, within ``index_s``.
    due : DueLists or None
        With a window: the lists whose refill deadline changed within the horizon.
    short : QueryColumns or None
        With a window: lists the batch's expiry left short that no refill came for (an
        announcement the coordinator had not seen). The batch was **not applied**: the
        coordinator sends it again with their refills (``k`` holds ``k + reserve``).
    """

    worker: int
    batch: int
    objects: int = 0
    candidates: int = 0
    passed: int = 0
    changed: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    redis_s: float = 0.0
    redis_server_s: float = 0.0
    index_s: float = 0.0
    write_queued: bool = False
    refilled: int = 0
    index_merges: int = 0
    handle_compactions: int = 0
    due: DueLists | None = None
    short: QueryColumns | None = None

    def with_write(self, w: WriteFigures) -> WorkerReport:
        """This report with its queued write's figures: the writing thread's CPU and the
        server's time join ``cpu_s``."""
        return replace(self, redis_s=w.redis_s, redis_server_s=w.redis_server_s,
                       cpu_s=self.cpu_s + w.writer_cpu_s + w.redis_server_s)
