"""What ``knnmon serve``'s ``/metrics`` and ``/readyz`` read (:mod:`~.probes` serves them).

- **Metrics** (:class:`~knnmon.coordinator.runtime.prometheus.KnnMetrics`): the counters are the
  service's own (:data:`~knnmon.coordinator.service.lifecycle.COUNTERS` and the rejects by stream
  and reason), read at each scrape. The workers' resident memory comes from their stats, asked by
  the service loop every :data:`WORKER_STATS_S` seconds (workers in other Ray processes report
  through the service). The stream lag is read from Redis at each scrape.
- **Readiness** (:meth:`ServiceTelemetry.readiness`): Redis answers, every worker is alive
  (:class:`~knnmon.coordinator.recovery.liveness.WorkerLiveness`) and none is being revived (a
  revival is over once the service's status shows it), the state is recovered, and
  the entries waiting in the ingest streams are at most ``max_lag``.

Scrapes and probes run in the HTTP server's thread: they read the service's state and never
change it, and Redis is read with a client of their own (1 s timeouts, no retries).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from knnmon.connection import connect
from knnmon.coordinator.recovery.liveness import WorkerLiveness
from knnmon.coordinator.runtime.prometheus import KnnMetrics, Readings, rss_bytes
from knnmon.protocol import group_info

if TYPE_CHECKING:
    from knnmon.coordinator.service.lifecycle import Lifecycle

__all__ = ["DEFAULT_MAX_LAG", "WORKER_STATS_S", "ServiceTelemetry"]

log = logging.getLogger("knnmon.serve")

#: Seconds between the service loop's requests of the workers' stats (their memory).
WORKER_STATS_S = 10.0
#: ``/readyz`` fails while more entries than this wait in the ingest streams (``serve.ready_max_lag``).
DEFAULT_MAX_LAG = 10_000
#: What a runtime counts that outlives it in the service's totals.
RUNTIME_TOTALS = ("replans", "queries_moved", "workers_revived")


class ServiceTelemetry:
    """Metrics and readiness of one service (module docstring).

    Parameters
    ----------
    svc : Lifecycle
        The service.
    max_lag : int
        Entries waiting (both ingest streams) above which the service is not ready.
    """

    def __init__(self, svc: Lifecycle, max_lag: int = DEFAULT_MAX_LAG) -> None:
        self.svc = svc
        self.max_lag = max_lag
        self.metrics = KnnMetrics(self.readings)
        self.liveness = WorkerLiveness()
        self.past = dict.fromkeys(RUNTIME_TOTALS, 0)  # of the runtimes before the current one
        self._rss: list[float | None] = []
        self._stats_at = float("-inf")
        self._client = None
        self._lock = threading.Lock()
        self._ready: tuple[float, bool, dict[str, str]] | None = None

    # -- the service loop's side -------------------------------------------------------------
    def started(self) -> None:
        """The workers (re)started: their checks and stats start anew."""
        self.liveness = WorkerLiveness(self.svc.runtime.pool)
        self._stats_at = float("-inf")

    def stopping_runtime(self) -> None:
        """The runtime is about to close: what it counted joins the totals."""
        for key, n in _runtime_counts(self.svc.runtime).items():
            self.past[key] += n
        self.liveness = WorkerLiveness()  # (no workers until the next start)

    def refresh(self) -> None:
        """Between batches, in the loop: the workers' stats when :data:`WORKER_STATS_S` passed."""
        now = time.monotonic()
        if self.svc.runtime is None or now - self._stats_at < WORKER_STATS_S:
            return
        self._stats_at = now
        try:
            stats = self.svc.runtime.registrar.stats()
        except Exception as ex:  # noqa: BLE001 - a lost worker: the loop's next batch revives it
            log.debug("the workers' stats could not be read (%s: %s)", type(ex).__name__, ex)
            return
        self._rss = rss_bytes(stats)

    def totals(self) -> dict[str, int]:
        """What the runtimes counted of :data:`RUNTIME_TOTALS` since the service started (the
        current one's and those it replaced)."""
        return {key: self.past[key] + n for key, n in _runtime_counts(self.svc.runtime).items()}

    # -- the HTTP server's side --------------------------------------------------------------
    def readings(self) -> Readings:
        """One scrape's values (:class:`~knnmon.coordinator.runtime.prometheus.Readings`)."""
        svc, ledger = self.svc, self.svc.ledger
        counters: dict[str, int] = {**svc.counters, **self.totals()}
        rt = svc.runtime
        now = time.monotonic()
        wall_ms = max(now - ledger.busy_since, 1e-3) * 1e3
        status = _runtime_status(rt)
        return Readings(
            counters=counters, rejected=dict(ledger.rejected), lag=self._lag(),
            worker_queries=status.queries_per_worker if status else [],
            worker_busy_ratio=(ledger.busy_ms / wall_ms).tolist(), worker_rss_bytes=list(self._rss),
            live_objects=status.objects_held if status else None,
            watermark_s=status.watermark_ms / 1e3 if status and status.watermark_ms is not None else None)

    def readiness(self, cache_s: float = 1.0) -> tuple[bool, dict[str, str]]:
        """Whether the service is ready, and each check's outcome (``ok`` or why not): ``redis``,
        ``workers``, ``recovery``, ``lag``. Checked at most once per ``cache_s`` seconds."""
        with self._lock:
            now = time.monotonic()
            if self._ready is not None and now - self._ready[0] < cache_s:
                return self._ready[1], dict(self._ready[2])
            checks = {"redis": self._check_redis(), "recovery": self._check_recovery(),
                      "workers": self._check_workers(), "lag": self._check_lag()}
            ok = all(v == "ok" for v in checks.values())
            self._ready = (time.monotonic(), ok, checks)
            return ok, dict(checks)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _redis(self) -> Any:
        if self._client is None:
            self._client = connect(self.svc.redis_url, socket_timeout_s=1.0)
        return self._client

    def _check_redis(self) -> str:
        if self.svc.redis_url is None:
            return "not started"
        try:
            self._redis().ping()
            return "ok"
        except Exception as ex:  # noqa: BLE001 - any failure is the answer
            return f"unreachable ({type(ex).__name__})"

    def _check_recovery(self) -> str:
        if self.svc.stopping:
            return "stopping"
        return "ok" if self.svc.serving else "recovering the state from Redis"

    def _check_workers(self) -> str:
        rt = self.svc.runtime
        if rt is not None and rt.reviver.reviving is not None:
            return f"worker {rt.reviver.reviving} being revived"
        if rt is not None and rt.workers_revived != self.svc.revivals_published:
            return "a revived worker's status not yet published"
        try:
            dead = self.liveness.dead()
        except Exception as ex:  # noqa: BLE001 - Ray itself unreachable
            return f"cannot check them ({type(ex).__name__})"
        return "ok" if not dead else f"worker(s) {', '.join(map(str, dead))} dead"

    def _check_lag(self) -> str:
        lag = self._lag()
        if len(lag) < 2:
            return "unknown (Redis did not answer)"
        waiting = sum(lag.values())
        return "ok" if waiting <= self.max_lag else f"{waiting:,} entries waiting (at most {self.max_lag:,})"

    def _lag(self) -> dict[str, int]:
        """Entries waiting per ingest stream (``objects``, ``queries``); a stream Redis did not
        report on is left out."""
        keys, out = self.svc.keys, {}
        read = {"objects": "objects_entries_read", "queries": "queries_entries_read"}
        for stream, key in (("objects", keys.ingest_objects), ("queries", keys.ingest_queries)):
            try:
                out[stream] = _waiting(self._redis(), key, self.svc.counters[read[stream]])
            except Exception:  # noqa: BLE001 - Redis away: no reading
                continue
        return out


def _waiting(client: Any, key: str, read: int) -> int:
    """Entries of stream ``key`` not yet delivered to the group or delivered and pending:
    XINFO GROUPS's ``lag`` (Redis 7+) where Redis knows it, else the stream's length less the
    entries read (``read``), plus the pending entries."""
    group = group_info(client, key)
    if group is None:
        return int(client.xlen(key)) if client.exists(key) else 0
    lag = group.get("lag")
    if lag is None:
        lag = max(int(client.xlen(key)) - read, 0)
    return int(lag) + int(group["pending"])


def _runtime_counts(rt: Any) -> dict[str, int]:
    """What runtime ``rt`` counted of :data:`RUNTIME_TOTALS` (zeros for ``None``)."""
    if rt is None:
        return dict.fromkeys(RUNTIME_TOTALS, 0)
    rb = rt.rebalancer
    return {"replans": len(rb.replans) if rb is not None else 0, "queries_moved": rb.queries_moved if rb else 0,
            "workers_revived": rt.workers_revived}


def _runtime_status(rt: Any) -> Any:
    """``rt.status()``, or ``None`` when there is no runtime or it is being replaced."""
    if rt is None or getattr(rt, "registrar", None) is None:
        return None
    try:
        return rt.status()
    except Exception:  # noqa: BLE001 - read while the loop changes it: no reading this time
        log.debug("the runtime's status could not be read for a scrape", exc_info=True)
        return None
