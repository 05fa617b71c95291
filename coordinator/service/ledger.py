"""The service's ledger: acknowledgements, the batch log, and what they count.

Entries are acknowledged only after their effect is in Redis
(:func:`~knnmon.coordinator.service.acks.acknowledge`, with their rejects in
``knn:ingest:rejects``); each (mini)batch is logged to ``knn:serve:batches`` (``first``,
``last`` entry ids, ``n``, ``done_ms``, what it cost, and ``lat_hist``: its objects' response
times from XADD to their minibatch's results written, :mod:`~knnmon.coordinator.service.latency`). With a window, the
objects stream is trimmed at checkpoints (:mod:`~knnmon.coordinator.recovery.checkpoint`).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pyarrow as pa
import redis

from knnmon.coordinator.runtime.metrics import BatchReport
from knnmon.coordinator.runtime.prometheus import KnnMetrics
from knnmon.coordinator.service import latency
from knnmon.coordinator.service.acks import EntryFields, acknowledge
from knnmon.coordinator.recovery.checkpoint import Checkpointer
from knnmon.coordinator.service.intake import Reject
from knnmon.keys import Keys
from knnmon.protocol import entry_order, entry_time_ms
from knnmon.window import Window

__all__ = ["Ledger"]


class Ledger:
    """Acknowledges and logs (module docstring), through the client it was last given
    (:meth:`connect`, each time the service (re)connects).

    Attributes
    ----------
    counters : dict of str to int
        The service's counters; ``rejects``, ``future``, ``objects_entries_read`` and
        ``queries_entries_read`` (less the rejected entries deleted), ``objects``, ``batches``, ``checkpoints`` and
        ``entries_trimmed`` are kept here.
    rejected : dict of (str, str) to int
        Entries rejected since start, by stream (``objects``, ``queries``) and reason
        (:data:`~knnmon.errors.REJECT_REASONS`).
    latencies : deque of numpy.ndarray
        Per batch (the last 1,000): each object's time from XADD to acknowledged, ms.
    busy_ms : numpy.ndarray
        ``(W,)`` float64: each worker's busy time since the workers started (:attr:`busy_since`,
        ``time.monotonic()`` seconds), ms.
    metrics : KnnMetrics or None
        Observes each batch's update time, Redis server time and response times (``serve
        --metrics``).
    """

    def __init__(self, keys: Keys, counters: dict[str, int], workers: int, metrics: KnnMetrics | None = None) -> None:
        self.keys = keys
        self.counters = counters
        self.metrics = metrics
        self.client: redis.Redis | None = None
        self.url: str | None = None
        self.checkpointer: Checkpointer | None = None
        self.rejected: dict[tuple[str, str], int] = {}
        self.latencies: deque[np.ndarray] = deque(maxlen=1000)
        self.reset_busy(workers)

    def connect(self, client: redis.Redis, url: str, checkpointer: Checkpointer | None) -> None:
        """Acknowledge through ``client`` (of Redis at ``url``) from now on; with a window,
        checkpoint with ``checkpointer``."""
        self.client, self.url, self.checkpointer = client, url, checkpointer

    def reset_busy(self, workers: int) -> None:
        """Start counting the workers' busy time anew (the workers started)."""
        self.busy_ms = np.zeros(workers)
        self.busy_since = time.monotonic()

    @property
    def rejects_by_reason(self) -> dict[str, int]:
        """Entries rejected since start, by reason, over both streams."""
        out: dict[str, int] = {}
        for (_, reason), n in list(self.rejected.items()):
            out[reason] = out.get(reason, 0) + n
        return out

    def ack(self, key: str, ids: list[str], rejects: list[Reject], record: EntryFields | None = None) -> None:
        """Acknowledge entries ``ids`` of stream ``key`` with their ``rejects`` (and log ``record``).
        One rule for every reject: the entry leaves its ingest stream with its acknowledgement,
        its fields (bounded) kept in ``ingest:rejects``. A stream then holds only what was applied:
        recovery never reads a reject again (Redis's clock will have caught up with an entry id
        from the future), and a hostile entry (1 MB of text) is not kept for good."""
        gone = [eid for eid, _, _ in rejects]
        acknowledge(self.client, self.url, self.keys, key, ids, rejects, record, delete=gone)
        self.counters["rejects"] += len(rejects)
        stream = "objects" if key == self.keys.ingest_objects else "queries"
        self.counters[f"{stream}_entries_read"] -= len(gone)  # the stream's length no longer counts them
        for _, _, r in rejects:
            self.rejected[stream, r.reason] = self.rejected.get((stream, r.reason), 0) + 1
        self.counters["future"] += sum(r.reason == "future" for _, _, r in rejects)

    def finish(self, ids: list[str], rejects: list[Reject], report: BatchReport | None, parse_ms: float,
               update_ms: float, top_t: int | None, refill_parts_ms: dict[str, float], window: Window | None,
               objects: pa.Table | None = None, read_done: bool = True) -> None:
        """Acknowledge one minibatch's objects' entries ``ids`` (and ``rejects``: the read's
        rejected entries go with its first minibatch), with its batch record; then checkpoint
        when due and ``read_done`` (the read's last minibatch), and count. ``top_t``: the largest
        time of its objects (``None``: none); ``objects``: the objects it applied (for the
        checkpoint's chunk).

        A checkpoint waits for the read's end: the first minibatch's span reaches over the read's
        rejects, so a chunk cut inside a read would claim entries whose objects come in the
        next minibatches (:mod:`~knnmon.coordinator.recovery.object_snapshot`)."""
        n_objects = len(ids)
        now_ms = time.time() * 1000
        acked = sorted(ids + [e for e, _, _ in rejects], key=entry_order)
        # an entry id from the future (within --max-future) counts no negative response time
        published_ms = np.minimum(np.array([entry_time_ms(e) for e in ids], dtype=np.float64), now_ms)
        done_ms = np.full(len(ids), now_ms)
        record = {"first": acked[0], "last": acked[-1], "n": len(acked), "objects": n_objects,
                  "rejects": len(rejects), "done_ms": f"{now_ms:.1f}", "parse_ms": f"{parse_ms:.2f}",
                  "update_ms": f"{update_ms:.2f}", "lat_hist": latency.encode(done_ms - published_ms)}
        if report is not None:  # what the batch cost: its deliveries, candidates, changes, refills
            record.update(deliveries=report.deliveries, candidates=report.candidates, changed=report.changed,
                          refilled=report.refilled, refill_ms=f"{report.refill_ms:.2f}",
                          redis_ms=f"{report.redis_server_ms:.2f}", route_ms=f"{report.route_ms:.2f}",
                          busy_max_ms=f"{max(report.busy_ms, default=0.0):.2f}",
                          busy_wall_max_ms=f"{max(report.busy_wall_ms, default=0.0):.2f}",
                          **{f"refill_{k}_ms": f"{v:.2f}" for k, v in refill_parts_ms.items()})
        self.ack(self.keys.ingest_objects, acked, rejects, record)
        if self.checkpointer is not None:
            self.checkpointer.add(acked[0], acked[-1], top_t, objects)
            if read_done and self.checkpointer.due():
                self.counters["entries_trimmed"] += self.checkpointer.checkpoint(window.watermark, window.cutoff)
                self.counters["checkpoints"] += 1
        if ids:
            self.latencies.append(time.time() * 1000 - published_ms)
        if self.metrics is not None:
            self.metrics.observe_batch(update_ms, report.redis_server_ms if report is not None else None,
                                       done_ms - published_ms)
        self.counters["objects"] += n_objects
        self.counters["batches"] += 1
        if report is not None:
            self.busy_ms += np.asarray(report.busy_ms)
            self.counters["result_changes"] += report.changed
            self.counters["refilled"] += report.refilled
