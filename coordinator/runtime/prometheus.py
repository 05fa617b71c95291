"""Prometheus metrics of ``knnmon serve`` and ``knnmon run`` (the ``prometheus-client`` library).

One :class:`KnnMetrics` per service or run holds its own registry (never the library's global
one, so that two services in one process do not share numbers):

- **counters** (``*_total``) and **gauges** are read when scraped, from a :class:`Readings` that
  the owner's ``read`` callback returns: the service's own counts, so a scrape never misses an
  increment and costs the service nothing between scrapes;
- **histograms** are observed as batches finish (:meth:`KnnMetrics.observe_batch`), many values
  per call (:class:`BulkHistogram`): a batch of 1,000 objects is one call, not 1,000.

Names, units and types follow Prometheus's conventions: seconds, bytes, ratios, ``_total`` for
counters. Workers in other Ray processes report through the service (their batch reports and
stats); nothing is scraped from an actor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from knnmon.coordinator.runtime.metrics import BatchReport, RunSummary
from knnmon.errors import REJECT_REASONS
from knnmon.reports import WorkerStats

__all__ = ["BATCH_BUCKETS_S", "COUNTERS", "RESPONSE_BUCKETS_S", "BulkHistogram", "KnnMetrics", "Readings",
           "rss_bytes", "run_metrics"]

#: Upper bounds (s) of the response-time histogram: publish (XADD) to the object's results written.
RESPONSE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Upper bounds (s) of the per-batch histograms (update time, Redis server time).
BATCH_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: The counters, by the key :attr:`Readings.counters` gives them under: (metric name without
#: ``_total``, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "objects": ("knnmon_objects_applied", "Objects applied: the kNN of every query they change is updated"),
    "batches": ("knnmon_batches", "Object batches applied"),
    "registered": ("knnmon_queries_registered", "Queries registered"),
    "updated": ("knnmon_queries_updated", "Registrations that replaced a query of the same id"),
    "unregistered": ("knnmon_queries_unregistered", "Queries unregistered"),
    "result_changes": ("knnmon_result_changes", "Changes of a query's top-k written to Redis"),
    "refilled": ("knnmon_results_refilled", "Results refilled after their objects left the window"),
    "replans": ("knnmon_replans", "Re-plans of the assignment while serving (re-balancing)"),
    "queries_moved": ("knnmon_queries_moved", "Queries moved to another worker by re-plans"),
    "workers_revived": ("knnmon_workers_revived", "Lost workers revived in place"),
    "recoveries": ("knnmon_recoveries", "Rebuilds of the whole state from Redis"),
}


@dataclass
class Readings:
    """What a scrape reads from the service or run (:class:`KnnMetrics`).

    Attributes
    ----------
    counters : dict of str to int
        Monotonic counts by the keys of :data:`COUNTERS` (a missing key is not exported).
    rejected : dict of (str, str) to int
        Entries rejected, by (stream: ``objects`` or ``queries``, reason of
        :data:`~knnmon.errors.REJECT_REASONS`).
    lag : dict of str to int
        Entries waiting per ingest stream (``objects``, ``queries``): not yet delivered to the
        service, or delivered and not yet acknowledged.
    worker_queries : list of int, ``(W,)``
        Registered queries each worker holds.
    worker_busy_ratio : list of float, ``(W,)``
        Each worker's busy time over the wall time since the workers started (0..1).
    worker_rss_bytes : list of float or None, ``(W,)``
        Each worker process's resident memory, bytes (``None``: unknown).
    live_objects : int or None
        Objects held (with a window: live ones).
    watermark_s : float or None
        The event-time watermark, Unix epoch seconds (with a window).
    """

    counters: Mapping[str, int] = field(default_factory=dict)
    rejected: Mapping[tuple[str, str], int] = field(default_factory=dict)
    lag: Mapping[str, int] = field(default_factory=dict)
    worker_queries: Sequence[int] = ()
    worker_busy_ratio: Sequence[float] = ()
    worker_rss_bytes: Sequence[float | None] = ()
    live_objects: int | None = None
    watermark_s: float | None = None


class BulkHistogram(Collector):
    """A Prometheus histogram fed arrays of values (numpy), thread-safe.

    Parameters
    ----------
    name, documentation : str
        The metric's name (with its unit, e.g. ``_seconds``) and help.
    buckets : sequence of float
        Upper bounds, increasing; ``+Inf`` is added.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(self._bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values: np.ndarray | Sequence[float]) -> None:
        """Count ``values`` (``(n,)`` float, the metric's unit); NaN and infinities are skipped."""
        v = np.asarray(values, dtype=np.float64).ravel()
        v = v[np.isfinite(v)]
        if not len(v):
            return
        counts = np.bincount(np.searchsorted(self._bounds, v, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(v.sum())

    @property
    def count(self) -> int:
        """Values observed so far."""
        return int(self._counts.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum
        bounds = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        yield HistogramMetricFamily(self.name, self.documentation, buckets=list(zip(bounds, cumulative.tolist())),
                                    sum_value=total)


class KnnMetrics(Collector):
    """The metrics of one service or run (module docstring), in :attr:`registry`.

    Parameters
    ----------
    read : callable returning Readings
        Called at each scrape (from the HTTP server's thread): it must only read.
    """

    def __init__(self, read: Callable[[], Readings]) -> None:
        self._read = read
        self.response_time = BulkHistogram(
            "knnmon_response_time_seconds", "Time from an object's publish (its entry id's time) to its results "
            "written to Redis", RESPONSE_BUCKETS_S)
        self.update_time = BulkHistogram("knnmon_batch_update_seconds", "Update time of an object batch: "
                                         "dispatched to its workers until their writes are in Redis", BATCH_BUCKETS_S)
        self.redis_server_time = BulkHistogram(
            "knnmon_batch_redis_server_seconds", "The Redis server's time running a batch's result writes "
            "(serial: Redis is single-threaded)", BATCH_BUCKETS_S)
        self.registry = CollectorRegistry()
        for c in (self, self.response_time, self.update_time, self.redis_server_time):
            self.registry.register(c)

    def observe_batch(self, update_ms: float, redis_server_ms: float | None,
                      response_ms: np.ndarray | None = None) -> None:
        """One batch: its update time and Redis server time (ms), and each applied object's
        response time (``(n,)`` float64 ms; ``None`` where there is no publish time, as in
        ``knnmon run``)."""
        self.update_time.observe([update_ms / 1e3])
        if redis_server_ms is not None:
            self.redis_server_time.observe([redis_server_ms / 1e3])
        if response_ms is not None:
            self.response_time.observe(np.asarray(response_ms, dtype=np.float64) / 1e3)

    def write(self, path: str) -> None:
        """Write one scrape in Prometheus's text format to ``path`` (atomically: the library
        writes a temporary file and renames it)."""
        write_to_textfile(path, self.registry)

    def collect(self) -> Iterator[Metric]:
        r = self._read()
        for key, (name, doc) in COUNTERS.items():
            if key in r.counters:
                yield CounterMetricFamily(name, doc, value=r.counters[key])
        for stream, what in (("objects", "knnmon_objects_rejected"), ("queries", "knnmon_query_operations_rejected")):
            family = CounterMetricFamily(what, f"Entries of the {stream} stream rejected, by reason", labels=["reason"])
            for reason in REJECT_REASONS:  # (each at 0 until its first reject: increase() sees that one too)
                family.add_metric([reason], r.rejected.get((stream, reason), 0))
            yield family
        lag = GaugeMetricFamily("knnmon_stream_lag_entries", "Entries of an ingest stream waiting: not yet "
                                "delivered to the service, or delivered and not yet acknowledged", labels=["stream"])
        for stream, n in sorted(r.lag.items()):
            lag.add_metric([stream], n)
        yield lag
        yield from _per_worker("knnmon_worker_queries", "Registered queries each worker holds", r.worker_queries)
        yield from _per_worker("knnmon_worker_busy_ratio", "Each worker's busy time over the wall time since the "
                               "workers started", r.worker_busy_ratio)
        yield from _per_worker("knnmon_worker_resident_memory_bytes", "Each worker process's resident memory",
                               r.worker_rss_bytes)
        if r.live_objects is not None:
            yield GaugeMetricFamily("knnmon_live_objects", "Objects held (with a window: live ones)",
                                    value=r.live_objects)
        if r.watermark_s is not None:
            yield GaugeMetricFamily("knnmon_watermark_seconds", "The event-time watermark (with a window), Unix "
                                    "epoch seconds", value=r.watermark_s)


def _per_worker(name: str, doc: str, values: Sequence[float | None]) -> Iterator[Metric]:
    family = GaugeMetricFamily(name, doc, labels=["worker"])
    for w, v in enumerate(values):
        if v is not None:
            family.add_metric([str(w)], float(v))
    yield family


def rss_bytes(stats: Sequence[WorkerStats]) -> list[float | None]:
    """Each worker's resident memory in bytes (:attr:`Readings.worker_rss_bytes`) from its stats'
    ``rss_mb`` (MiB; ``None``: unknown)."""
    return [s.rss_mb * 2**20 if s.rss_mb is not None else None for s in stats]


def run_metrics(summary: RunSummary, reports: Sequence[BatchReport]) -> KnnMetrics:
    """The metrics of a finished ``knnmon run`` (``run.metrics_file``), as a scrape at its end
    would read them: the counters from ``summary``, the per-batch histograms from ``reports``.
    A run has no publish times, so its response-time histogram stays empty; its workers'
    busy ratio is over the run's wall time (``summary.wall_s``)."""
    applied = summary.objects - summary.duplicates_ignored - summary.late_ignored
    counters = {"objects": applied, "batches": summary.batches, "result_changes": summary.results_changed,
                "refilled": summary.results_refilled, "replans": len(summary.replans),
                "queries_moved": summary.queries_moved, "workers_revived": summary.workers_revived}
    stats = summary.workers_stats
    wall_ms = max(summary.wall_s, 1e-6) * 1e3
    readings = Readings(counters=counters, worker_queries=[s.queries for s in stats],
                        worker_busy_ratio=[b / wall_ms for b in summary.busy_ms_per_worker],
                        worker_rss_bytes=rss_bytes(stats))
    metrics = KnnMetrics(lambda: readings)
    for r in reports:
        metrics.observe_batch(r.update_ms, r.redis_server_ms)
    return metrics
