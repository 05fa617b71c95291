"""What ``knnmon serve`` is doing: published by the service, read by ``knnmon status``.

The service writes :func:`snapshot` to ``knn:serve:status`` about once a second
(:func:`publish`); any process reads it back with the streams' state (:func:`read_status`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from knnmon.connection import connect, redact
from knnmon.heap import full_gc_passes
from knnmon.protocol import GROUP, entry_time_ms, group_info
from knnmon.keys import DEFAULT_NAMESPACE, Keys

if TYPE_CHECKING:
    from knnmon.coordinator.service.lifecycle import Lifecycle

__all__ = ["STALE_S", "Heartbeat", "format_status", "publish", "read_status", "snapshot"]

log = logging.getLogger("knnmon.serve")

#: A service whose heartbeat is older than this is reported as not running.
STALE_S = 10.0


def snapshot(svc: Lifecycle) -> dict[str, Any]:
    """The status of a running :class:`~knnmon.coordinator.service.loop.Service`: process,
    heartbeat, settings (without the Redis URL), queries and predicted load per worker, measured
    busy time per worker, the workers' nodes, the address of ``/metrics`` (``None``: off),
    latency XADD -> acknowledged (p50, p99 over the last 1,000 batches, ms), the objects held
    (with a window: live), the routing table's entries, the watermark and the largest ``t``
    applied (with a window), the rejects by reason since start, the batching policy's state
    (:meth:`~knnmon.coordinator.service.batching.BatchPolicy.state`), the garbage collector's full
    passes (:func:`~knnmon.heap.full_gc_passes`), and the service's counters."""
    rt = svc.runtime.status() if svc.runtime is not None else None
    ledger = svc.ledger
    lat = np.concatenate(list(ledger.latencies)) if ledger.latencies else np.zeros(0)
    config = svc.config.settings()
    config["store"] = {k: v for k, v in config["store"].items() if k != "url"}
    return {
        "pid": os.getpid(), "host": socket.gethostname(), "started_ms": svc.started_ms,
        "heartbeat_ms": int(time.time() * 1000), "stopping": svc.stopping, "config": config,
        "workers": svc.config.run.workers, "algorithm": svc.config.run.algorithm,
        "queries_per_worker": rt.queries_per_worker if rt else [],
        "predicted_load_per_worker": rt.predicted_load_per_worker if rt else [],
        "busy_ms_per_worker": ledger.busy_ms.round(1).tolist(),
        "workers_revived": svc.telemetry.totals()["workers_revived"],
        "worker_nodes": [w.node for w in svc.workers],
        "worker_processes": [{"worker": w.worker, "node": w.node, "pid": w.pid} for w in svc.workers],
        "redis": redact(svc.redis_url), "data_dir": svc.config.run.store.data_dir,
        "metrics": svc.probes.address if svc.probes is not None else None,
        "latency_ms_p50": float(np.percentile(lat, 50)) if len(lat) else None,
        "latency_ms_p99": float(np.percentile(lat, 99)) if len(lat) else None,
        "objects_held": rt.objects_held if rt else None,
        "routing_entries": rt.routing_entries if rt else None,
        "watermark_ms": rt.watermark_ms if rt else None,
        "top_t_ms": rt.top_t_ms if rt else None,
        "rejects_by_reason": dict(sorted(ledger.rejects_by_reason.items())),
        "batching": svc.batching.state(),
        "gc_full_passes": full_gc_passes().state(),
        **svc.counters,
    }


def running_service(client: redis.Redis, keys: Keys) -> dict[str, Any] | None:
    """The status a running service published in this namespace: fresh (younger than
    :data:`STALE_S`), not stopping, and, when it names this host, its process alive; else ``None``."""
    raw = client.get(keys.serve_status)
    if not raw:
        return None
    try:
        s = json.loads(raw)
        fresh = time.time() * 1000 - s["heartbeat_ms"] < STALE_S * 1000 and not s.get("stopping")
        if fresh and s.get("host") == socket.gethostname():
            os.kill(int(s["pid"]), 0)
    except (ValueError, KeyError, TypeError, ProcessLookupError):
        return None
    except PermissionError:  # alive, another user's
        pass
    return s if fresh else None


def publish(svc: Lifecycle) -> None:
    """Write :func:`snapshot` to ``knn:serve:status`` (a Redis outage is logged, not raised:
    the service loop notices it on its next read)."""
    try:
        svc.client.set(svc.keys.serve_status, json.dumps(snapshot(svc)))
    except (redis.ConnectionError, redis.TimeoutError) as ex:
        log.warning("could not publish status: %s", ex)


@dataclass
class StreamState:
    """An ingest stream's entries (``length``), those delivered and not acknowledged
    (``pending``), those not read yet (``undelivered``; ``None``: unknown), and the age of the
    oldest waiting one (ms: the stream lag; ``None``: none waits)."""

    length: int
    pending: int = 0
    undelivered: int | None = None
    oldest_waiting_ms: int | None = None


def _stream(client, key: str, read: int | None) -> StreamState:
    """The :class:`StreamState` of ``key``, of which the service read ``read`` entries."""
    out = StreamState(client.xlen(key) if client.exists(key) else 0)
    if not out.length:
        return out
    group = group_info(client, key)
    if group is None:
        out.undelivered = out.length
        return out
    out.pending = group["pending"]
    if read is not None:
        out.undelivered = max(out.length - read, 0)
    oldest = None
    if group["pending"]:
        oldest = client.xpending(key, GROUP)["min"]
    else:
        last = group["last-delivered-id"]
        nxt = client.xrange(key, min="(" + last if last != "0-0" else "-", max="+", count=1)
        oldest = nxt[0][0] if nxt else None
    if oldest:
        out.oldest_waiting_ms = max(int(time.time() * 1000) - entry_time_ms(oldest), 0)
    return out


def read_status(url: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """The service's last published status plus the streams' state, from Redis.

    Returns
    -------
    dict
        ``running`` (heartbeat younger than 10 s), ``service`` (the hash the service publishes,
        or ``None``), ``queries`` (registered), ``objects_stream`` / ``queries_stream``
        (``length``, ``pending``, ``undelivered``, ``oldest_waiting_ms``: the stream lag),
        ``rejects`` (entries in ``knn:ingest:rejects``), ``changes`` (entries in the change feed: one per write of a worker).
    """
    keys = Keys(namespace)
    client = connect(url)
    try:
        raw = client.get(keys.serve_status)
        service = json.loads(raw) if raw else None
        running = bool(service) and time.time() * 1000 - service["heartbeat_ms"] < STALE_S * 1000 \
            and not service.get("stopping")
        return {
            "running": running, "service": service, "queries": client.scard(keys.queries),
            "objects_stream": asdict(_stream(client, keys.ingest_objects,
                                             service and service.get("objects_entries_read"))),
            "queries_stream": asdict(_stream(client, keys.ingest_queries,
                                             service and service.get("queries_entries_read"))),
            "rejects": client.xlen(keys.ingest_rejects) if client.exists(keys.ingest_rejects) else 0,
            "changes": client.xlen(keys.changes) if client.exists(keys.changes) else 0,
        }
    finally:
        client.close()


def format_status(s: dict[str, Any]) -> str:
    """:func:`read_status` as readable lines."""
    svc = s["service"]
    lines = []
    if svc is None:
        lines.append("service: never ran in this namespace")
    else:
        age = time.time() - svc["heartbeat_ms"] / 1000
        lines.append(f"service: {'running' if s['running'] else 'NOT running'} (pid {svc['pid']} on {svc['host']}, "
                     f"last heartbeat {age:.1f} s ago), {svc['algorithm']} on {svc['workers']} workers")
        lines.append(f"  objects {svc['objects']:,} in {svc['batches']:,} batches; queries registered "
                     f"{svc['registered']:,}, updated {svc['updated']:,} (+{svc.get('unchanged', 0)} unchanged), unregistered {svc['unregistered']:,} "
                     f"(+{svc['unregister_unknown']} unknown); workers revived {svc.get('workers_revived', 0)}; recoveries {svc['recoveries']} (worker restarts "
                     f"{svc.get('worker_restarts', 0)}); Redis outages ridden out {svc.get('redis_outages', 0)}; "
                     f"entries that failed inside knnmon {svc.get('internal_errors', 0)}")
        if svc.get("latency_ms_p50") is not None:
            lines.append(f"  latency XADD -> result written: p50 {svc['latency_ms_p50']:.1f} ms, "
                         f"p99 {svc['latency_ms_p99']:.1f} ms (last 1,000 batches)")
        b = svc.get("batching")
        if b:
            cost = (f"; a minibatch costs {b['cost_fixed_ms']:.1f} ms + {b['cost_per_object_ms']:.3f} ms per object"
                    if b.get("cost_fixed_ms") is not None else "")
            lines.append(f"  batching {b['policy']}: minibatches of up to "
                         f"{b['minibatch']:,} objects at {b['arrival_per_s']:,.0f} objects/s arriving{cost}"
                         + (f"; {b['regrouped']:,} reads finished in one batch (their minibatches fell behind)"
                            if b.get("regrouped") else ""))
        if svc.get("metrics"):
            lines.append(f"  metrics http://{svc['metrics']}/metrics; probes /healthz, /readyz")
        by_reason = svc.get("rejects_by_reason") or {}
        if by_reason:
            lines.append("  rejected since start: " + ", ".join(f"{r} {n:,}" for r, n in by_reason.items()))
        if svc.get("watermark_ms") is not None:
            lateness = svc["config"].get("allowed_lateness") or 0
            lines.append(f"  window {svc['config']['window'] / 1e3:,.0f} s"
                         f"{f' (allowed lateness {lateness / 1e3:,.0f} s)' if lateness else ''}: watermark {svc['watermark_ms']}, "
                         f"{svc.get('objects_held') or 0:,} live objects, {svc.get('late', 0):,} late rejected, "
                         f"{svc.get('checkpoints', 0):,} checkpoints trimmed {svc.get('entries_trimmed', 0):,} "
                         f"entries; routing entries {svc.get('routing_entries') or 0:,}")
        lines.append("  worker  node      pid      queries  predicted load  busy ms (measured)")
        procs = svc.get("worker_processes") or []
        for w in range(svc["workers"]):
            node = (svc["worker_nodes"][w] or "-")[:8] if w < len(svc["worker_nodes"]) else "-"
            pid = str(procs[w].get("pid") or "-") if w < len(procs) else "-"
            q = svc["queries_per_worker"][w] if svc["queries_per_worker"] else 0
            pl = svc["predicted_load_per_worker"][w] if svc["predicted_load_per_worker"] else 0.0
            lines.append(f"  {w:>6}  {node:<8}  {pid:<7} {q:>8,}  {pl:>14.6g}  {svc['busy_ms_per_worker'][w]:>12,.1f}")
    lines.append(f"queries registered: {s['queries']:,}; rejects: {s['rejects']:,}; change feed entries: {s['changes']:,}")
    for name in ("objects_stream", "queries_stream"):
        st = s[name]
        lag = "-" if st["oldest_waiting_ms"] is None else f"{st['oldest_waiting_ms']:,} ms"
        und = "?" if st["undelivered"] is None else f"{st['undelivered']:,}"
        lines.append(f"{name.replace('_', ' ')}: {st['length']:,} entries, {und} not yet read, "
                     f"{st['pending']:,} in flight; oldest waiting entry {lag}")
    return "\n".join(lines)


class Heartbeat:
    """``knn:serve:alive`` (epoch ms) refreshed every ``every_s`` on a thread of its own while
    the service lives, from before its workers start (a recovery may take minutes); the service's
    detached worker actors exit when it is gone for good (:mod:`knnmon.workers.actor`). A Redis
    that does not answer is tried again at the next beat. :meth:`stop` deletes the key."""

    def __init__(self, url: str, keys: Keys, every_s: float = 5.0) -> None:
        import threading

        self.url, self.keys, self.every_s = url, keys, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="knnmon-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = connect(self.url, socket_timeout_s=5.0)
        try:
            while True:
                try:
                    client.set(self.keys.serve_alive, str(int(time.time() * 1000)))
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if self._stop.wait(self.every_s):
                    return
        finally:
            client.close()

    def stop(self) -> None:
        """Stop beating and delete the key (idempotent; a Redis away leaves it to age)."""
        self._stop.set()
        self._thread.join(timeout=10)
        client = connect(self.url, socket_timeout_s=5.0)
        try:
            client.delete(self.keys.serve_alive)
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        finally:
            client.close()
