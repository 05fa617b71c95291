"""``knnmon serve``: the runtime as a long-running service that any Redis client talks to.

Clients add entries to two Redis streams (:mod:`knnmon.coordinator.stream_entries` has their
fields): ``knn:ingest:queries`` (register / unregister) and ``knn:ingest:objects``. The service
reads them as consumer ``serve`` of the consumer group ``knnmon`` and

- applies query operations one by one: a register of an id that exists with other parameters
  is an **update** (unregister, then register: a new result whose version restarts at 0; counted
  as ``updated``), with the same parameters a no-op (``unchanged``: a retried client, or an
  operation applied again after a restart); an unregister of an unknown id is a no-op, counted
  as ``unregister_unknown``;
- processes objects in **batches**: up to ``batch`` objects, waiting at most ``max_delay_ms``
  after the first one for more (under load batches fill at once, idle streams are served with
  the latency of one read: Fischer & Kossmann, ICDE 2005, "batching pays under load");
- writes malformed entries to ``knn:ingest:rejects`` with their original fields and ``_reason``,
  ``_detail``, ``_stream``, ``_entry``; a second object with an id seen before is rejected as
  ``duplicate_id`` (the first one counts);
- acknowledges entries (XACK, in one MULTI with their rejects) only after their effect is in
  Redis, and logs each batch to ``knn:serve:batches`` (``first``, ``last`` entry ids, ``n``,
  ``done_ms``), from which XADD-to-result latency is measured.

**Restart without loss or duplication.** The results are a function of the set of objects seen
(ties by id), so recovery recomputes them rather than replaying: the queries come from Redis
(``knn:queries`` and their hashes), the objects from ``--objects`` plus every entry of
``knn:ingest:objects`` the group has delivered, acknowledged or not; each query's exact kNN over
them is compared with its stored result, and a query whose result differs (a batch that was only
partly written when the service died) gets the difference written as one change, with one
``knn:changes`` entry. Delivered but unacknowledged object entries are then acknowledged (their
rejects written); unacknowledged query operations are applied again (both kinds are idempotent).
The same recovery runs when Redis goes away mid-stream: the service retries with backoff, logs
it, and resumes from what Redis holds.

SIGTERM (or Ctrl-C) lets the batch in flight finish and be acknowledged, then stops cleanly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import redis

from knnmon.connection import StoreUnavailableError, connect, redis_url_from_env, with_retries
from knnmon.coordinator.runtime import RunConfig, Runtime, prepare_tables
from knnmon.coordinator.stream_entries import ObjectEntry, Rejected, entry_order, entry_time_ms, parse_object, parse_query_op
from knnmon.errors import InvalidArgumentError, InvalidQueryError
from knnmon.keys import DEFAULT_NAMESPACE, Keys
from knnmon.redis_server import EmbeddedRedis

__all__ = ["GROUP", "ServeConfig", "Service", "group_info"]

log = logging.getLogger("knnmon.serve")

#: The consumer group ``knnmon serve`` reads both ingest streams with.
GROUP = "knnmon"
#: Approximate caps of the service's own streams (XADD MAXLEN ~).
REJECTS_MAXLEN = 1_000_000
BATCHES_MAXLEN = 100_000


def group_info(client: redis.Redis, key: str) -> dict[str, Any] | None:
    """XINFO GROUPS of stream ``key`` for the group ``knnmon`` (``pending``,
    ``last-delivered-id``, ...); ``None`` if the stream or the group does not exist."""
    if not client.exists(key):
        return None
    return next((g for g in client.xinfo_groups(key) if g["name"] == GROUP), None)


_OBJECT_SCHEMA = pa.schema([("id", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()), ("t", pa.int64()),
                            ("keywords", pa.list_(pa.string()))])


@dataclass(frozen=True)
class ServeConfig:
    """The ``knnmon serve`` flags.

    Raises
    ------
    InvalidArgumentError
        ``max_delay_ms < 0``, ``initial < 0``, ``block_ms < 1``, a missing ``objects_dir``, or
        what :class:`RunConfig` rejects (workers outside 1..64, ``batch < 1``, an unknown
        executor).
    """

    workers: int = 2
    algorithm: str = "proposed"
    objects_dir: str | None = None
    initial: int | None = None
    redis_url: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    data_dir: str = "knnmon-data"
    ray_address: str | None = None
    executor: str = "ray"
    batch: int = 1000
    max_delay_ms: float = 20.0
    block_ms: int = 500
    consumer: str = "serve"
    processes: int = 2

    def __post_init__(self) -> None:
        if self.max_delay_ms < 0:
            raise InvalidArgumentError(f"--max-delay-ms must be >= 0; got {self.max_delay_ms}")
        if self.initial is not None and self.initial < 0:
            raise InvalidArgumentError(f"--initial must be >= 0; got {self.initial}")
        if self.block_ms < 1:
            raise InvalidArgumentError(f"--block-ms must be >= 1; got {self.block_ms}")
        if self.objects_dir is not None and not os.path.isdir(self.objects_dir):
            raise InvalidArgumentError(f"--objects: no such directory: {self.objects_dir}")
        self.run_config("redis://unused")  # validates workers, batch, executor

    def run_config(self, redis_url: str) -> RunConfig:
        """The :class:`RunConfig` of the runtime the service drives."""
        return RunConfig(workers=self.workers, algorithm=self.algorithm, initial=0, batch=self.batch,
                         redis_url=redis_url, data_dir=self.data_dir, namespace=self.namespace,
                         ray_address=self.ray_address, executor=self.executor, processes=self.processes)


class Service:
    """The service (module docstring). ``start()``, then ``run()``; ``close()`` at the end.

    Attributes
    ----------
    counters : dict of int
        ``objects``, ``batches``, ``rejects``, ``registered``, ``updated``, ``unchanged``, ``unregistered``,
        ``unregister_unknown``, ``recoveries``, ``objects_entries_read``, ``queries_entries_read``.
    """

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.keys = Keys(config.namespace)
        self.redis: EmbeddedRedis | None = None
        self.redis_url: str | None = None
        self.client: redis.Redis | None = None
        self.runtime: Runtime | None = None
        self.stopping = False
        self.counters = dict.fromkeys(("objects", "batches", "rejects", "registered", "updated", "unchanged",
                                       "unregistered",
                                       "unregister_unknown", "recoveries", "objects_entries_read",
                                       "queries_entries_read"), 0)
        self.busy_ms = np.zeros(config.workers)
        self.latencies: deque[np.ndarray] = deque(maxlen=1000)  # per batch: XADD -> acknowledged, ms
        self.started_ms = int(time.time() * 1000)
        self.nodes: list[Any] = []
        self.specs: dict[str, tuple] = {}  # qid -> (lon, lat, keywords, k) of every registered query
        self._model = None
        self._preload: pa.Table | None = None
        self._status_at = 0.0

    # -- start and recovery ------------------------------------------------------------------
    def start(self) -> Service:
        """Start (or attach to) Redis, recover the state it holds, start the workers."""
        url = redis_url_from_env(self.config.redis_url)
        if url is None:
            self.redis = EmbeddedRedis(os.path.join(self.config.data_dir, "redis"), durable=True, reuse=True).start()
            url = self.redis.url
        self.redis_url = url
        self._load_preload()
        self._recover()
        return self

    def _load_preload(self) -> None:
        from knnmon.assignment import LoadModel
        from knnmon.coordinator.plan import stream_order
        from knnmon.ingest.queries import read_objects

        if self.config.objects_dir:
            self._model = LoadModel.from_ingest(self.config.objects_dir)
            table = read_objects(self.config.objects_dir, ["id", "lon", "lat", "t", "keywords"])
            table = stream_order(table, None).cast(_OBJECT_SCHEMA)
            n = table.num_rows if self.config.initial is None else min(self.config.initial, table.num_rows)
            self._preload = table.slice(0, n)
        else:
            self._model = LoadModel.uniform()
            self._preload = _OBJECT_SCHEMA.empty_table()

    def _connect(self) -> redis.Redis:
        """A client once Redis answers; waits with capped exponential backoff, logging each miss."""
        delay = 0.2
        while True:
            try:
                client = connect(self.redis_url)
                client.ping()
                return client
            except (redis.ConnectionError, redis.TimeoutError) as ex:
                if self.stopping:
                    raise StoreUnavailableError(f"Redis at {self.redis_url} unreachable while stopping") from ex
                log.warning("Redis at %s unreachable (%s); retrying in %.1f s", self.redis_url, ex, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _recover(self) -> None:
        """Rebuild the state from Redis and the ingest streams (module docstring)."""
        t0 = time.perf_counter()
        self.client = client = self._connect()
        for key in (self.keys.ingest_objects, self.keys.ingest_queries):
            try:
                client.xgroup_create(key, GROUP, id="0", mkstream=True)
            except redis.ResponseError as ex:
                if "BUSYGROUP" not in str(ex):
                    raise
        objects, pending, rejects = self._read_object_log()
        queries, versions = self._read_queries()
        self.counters["queries_entries_read"] = client.xlen(self.keys.ingest_queries) - self._undelivered(
            self.keys.ingest_queries)
        # The initial kNN forks helper processes, which is unsafe once Ray's threads run here
        # (a restart while connected to a cluster): then it searches in this process only.
        processes = 1 if _ray_running() else self.config.processes
        prepared = prepare_tables(self._model, queries, objects, _OBJECT_SCHEMA.empty_table(), processes=processes)
        prepared.versions = self._reconcile(prepared, versions)
        self.runtime = Runtime(None, None, self.config.run_config(self.redis_url), prepared, resume=True).start()
        self.specs = {r["id"]: _spec(r["lon"], r["lat"], r["keywords"], r["k"]) for r in queries.to_pylist()}
        self._ack(self.keys.ingest_objects, pending, rejects)
        self.busy_ms = np.zeros(self.config.workers)
        self.nodes = [s.get("node") for s in self.runtime.worker_stats()]
        log.info("recovered %d queries over %d objects (%d entries re-acknowledged) in %.1f s", queries.num_rows,
                 objects.num_rows, len(pending), time.perf_counter() - t0)
        self._publish_status(force=True)

    def _group_info(self, key: str) -> dict[str, Any]:
        g = group_info(self.client, key)
        if g is None:
            raise StoreUnavailableError(f"consumer group {GROUP!r} vanished from {key}")
        return g

    def _read_object_log(self, chunk: int = 10_000) -> tuple[pa.Table, list[str], list[tuple[str, dict, Rejected]]]:
        """Preloaded objects plus every delivered entry of the objects stream; the ids of the
        delivered but unacknowledged entries, and the rejects among those."""
        key = self.keys.ingest_objects
        last = self._group_info(key)["last-delivered-id"]
        pending = set()
        if last != "0-0":
            summary = self.client.xpending(key, GROUP)
            if summary["pending"]:
                rows = self.client.xpending_range(key, GROUP, min="-", max="+", count=summary["pending"])
                pending = {r["message_id"] for r in rows}
        seen = set(self._preload.column("id").to_pylist())
        parsed: list[ObjectEntry] = []
        rejects: list[tuple[str, dict, Rejected]] = []
        start, read = "-", 0
        while last != "0-0":
            entries = self.client.xrange(key, min=start, max=last, count=chunk)
            for eid, fields in entries:
                read += 1
                try:
                    o = parse_object(eid, fields)
                    if o.id in seen:
                        raise Rejected("duplicate_id", f"id={o.id}")
                    seen.add(o.id)
                    parsed.append(o)
                except Rejected as r:
                    if eid in pending:
                        rejects.append((eid, fields, r))
            if len(entries) < chunk:
                break
            start = "(" + entries[-1][0]
        self.counters["objects_entries_read"] = read
        table = pa.concat_tables([self._preload, _objects_table(parsed)]) if parsed else self._preload
        return table, sorted(pending, key=entry_order), rejects

    def _undelivered(self, key: str) -> int:
        last = self._group_info(key)["last-delivered-id"]
        return len(self.client.xrange(key, min="(" + last if last != "0-0" else "-", max="+"))

    def _read_queries(self, chunk: int = 10_000) -> tuple[pa.Table, np.ndarray]:
        """The registered queries (``knn:queries`` and their hashes) and their versions."""
        qids = sorted(self.client.smembers(self.keys.queries))
        rows, versions = [], []
        for s in range(0, len(qids), chunk):
            pipe = self.client.pipeline(transaction=False)
            for qid in qids[s:s + chunk]:
                pipe.hgetall(self.keys.query(qid))
            for qid, h in zip(qids[s:s + chunk], pipe.execute()):
                try:
                    rows.append((qid, float(h["lon"]), float(h["lat"]), h["keywords"].split(), int(h["k"])))
                    versions.append(int(h.get("version", 0)))
                except (KeyError, ValueError):
                    log.warning("query %s: unreadable hash %r in Redis; left out", qid, h)
        ids, lon, lat, kws, k = (list(c) for c in zip(*rows)) if rows else ([], [], [], [], [])
        table = pa.table({"id": pa.array(ids, pa.string()), "lon": pa.array(lon, pa.float64()),
                          "lat": pa.array(lat, pa.float64()), "keywords": pa.array(kws, pa.list_(pa.string())),
                          "k": pa.array(k, pa.int32())})
        return table, np.asarray(versions, dtype=np.int64)

    def _reconcile(self, prepared, versions: np.ndarray, chunk: int = 5000) -> np.ndarray:
        """Make every stored result equal the recomputed exact kNN; returns the versions.

        A differing result gets the difference (entered, left) written as one change, with its
        ``knn:changes`` entry and object reference counts, through the workers' script."""
        from knnmon.coordinator.object_store import ObjectStore
        from knnmon.workers.result_writer import ResultWriter

        q = prepared.queries
        if not q.num_rows:
            return versions
        qids = q.column("id").to_pylist()
        ends = np.cumsum(prepared.counts)
        starts = ends - prepared.counts
        obj_ids = prepared.index.ids if prepared.index is not None else np.empty(0, dtype=object)
        store = ObjectStore(prepared.initial, prepared.index)
        writer = ResultWriter(self.redis_url, self.config.namespace, "recovery")
        versions = versions.copy()
        fixed = 0
        for s in range(0, len(qids), chunk):
            part = range(s, min(s + chunk, len(qids)))
            pipe = self.client.pipeline(transaction=False)
            for i in part:
                pipe.zrange(self.keys.result(qids[i]), 0, -1, withscores=True)
            stored = pipe.execute()
            changed, ne, entered, dists, nl, left, rows, refs = [], [], [], [], [], [], [], {}
            for i, old in zip(part, stored):
                new = [(str(obj_ids[j]), float(d)) for j, d in zip(prepared.idx[starts[i]:ends[i]],
                                                                  prepared.dist[starts[i]:ends[i]])]
                if new == [(o, float(d)) for o, d in old]:
                    continue
                old_ids = {o for o, _ in old}
                new_ids = {o for o, _ in new}
                add = [(o, d) for o, d in new if o not in old_ids]
                gone = [o for o, _ in old if o not in new_ids]
                changed.append(i)
                ne.append(len(add))
                entered += [o for o, _ in add]
                dists += [d for _, d in add]
                nl.append(len(gone))
                left += gone
                rows += [int(j) for j, (o, _) in zip(prepared.idx[starts[i]:ends[i]], new) if o not in old_ids]
                for o, _ in add:
                    refs[o] = refs.get(o, 0) + 1
                for o in gone:
                    refs[o] = refs.get(o, 0) - 1
            if not changed:
                continue
            versions[changed] += 1
            writer.write_batch(-1 - s, [qids[i] for i in changed], versions[changed].tolist(), ne, entered, dists,
                               nl, left, list(refs), list(refs.values()), store.initial_info(np.asarray(rows)))
            fixed += len(changed)
        writer.close()
        if fixed:
            log.warning("recovery: %d stored results differed from the exact kNN over the delivered objects (work in "
                        "flight when the service stopped) "
                        "and were repaired, one knn:changes entry each", fixed)
        return versions

    # -- acknowledging -----------------------------------------------------------------------
    def _ack(self, key: str, ids: list[str], rejects: list[tuple[str, dict, Rejected]],
             batch_record: dict[str, Any] | None = None) -> None:
        """Write ``rejects`` and acknowledge ``ids`` of ``key`` in one MULTI (exactly once: a
        retry first checks whether the entries are still pending)."""
        if not ids:
            return

        def op() -> None:
            pipe = self.client.pipeline(transaction=True)
            for eid, fields, r in rejects:
                pipe.xadd(self.keys.ingest_rejects, {**fields, "_reason": r.reason, "_detail": str(r),
                                                     "_stream": key, "_entry": eid},
                          maxlen=REJECTS_MAXLEN, approximate=True)
            pipe.xack(key, GROUP, *ids)
            if batch_record is not None:
                pipe.xadd(self.keys.serve_batches, batch_record, maxlen=BATCHES_MAXLEN, approximate=True)
            pipe.execute()

        def done() -> bool:
            return not self.client.xpending_range(key, GROUP, min=ids[0], max=ids[0], count=1)

        with_retries(op, f"acknowledging {len(ids)} entries of {key}", self.redis_url, before_retry=done)
        self.counters["rejects"] += len(rejects)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, *, max_batches: int | None = None, idle_exit_s: float | None = None) -> dict[str, int]:
        """Serve until SIGTERM/SIGINT (or :meth:`stop`); returns the counters.

        ``max_batches`` and ``idle_exit_s`` (stop after that many seconds with nothing to do)
        bound a run for tests and benchmarks. Redis going away: retried with backoff, logged,
        then the state is recovered from Redis (nothing acknowledged is lost).
        """
        self._install_signals()
        self._apply_pending_query_ops()
        idle_since = time.monotonic()
        failures = 0
        while not self.stopping:
            try:
                did = self._step()
                failures = 0
            except Exception as ex:  # noqa: BLE001 - any failure of a step: recover, or give up after 10
                failures += 1
                if failures > 10 or not _is_connection_failure(ex):
                    raise
                log.warning("step failed (%s: %s); recovering from Redis (attempt %d)", type(ex).__name__, ex,
                            failures)
                self._restart()
                continue
            if did:
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
            if max_batches is not None and self.counters["batches"] >= max_batches:
                break
            self._publish_status()
        self._publish_status(force=True)
        return dict(self.counters)

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish the batch in flight and return."""
        if not self.stopping:
            log.info("stopping: finishing the batch in flight")
        self.stopping = True

    def _install_signals(self) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)

    def _restart(self) -> None:
        """Drop the workers and rebuild everything from Redis."""
        self.counters["recoveries"] += 1
        self._drop_workers()
        time.sleep(0.5)
        self._recover()
        self._apply_pending_query_ops()

    def _read(self, streams: dict[str, str], count: int, block_ms: int | None) -> list:
        return self.client.xreadgroup(GROUP, self.config.consumer, streams, count=count, block=block_ms) or []

    def _apply_pending_query_ops(self) -> None:
        """Re-apply query operations delivered before a restart but never acknowledged."""
        while True:
            got = self._read({self.keys.ingest_queries: "0"}, 1000, None)
            entries = got[0][1] if got else []
            if not entries:
                return
            self._apply_query_ops(entries)

    def _step(self) -> bool:
        """One read of both streams; query operations applied, objects batched. ``True`` if
        anything was done."""
        ko, kq = self.keys.ingest_objects, self.keys.ingest_queries
        got = self._read({kq: ">", ko: ">"}, self.config.batch, self.config.block_ms)
        objects: list = []
        for key, entries in got:
            if key == kq:
                self.counters["queries_entries_read"] += len(entries)
                self._apply_query_ops(entries)
            else:
                objects += entries
        if objects:
            deadline = time.monotonic() + self.config.max_delay_ms / 1000
            while len(objects) < self.config.batch:
                wait = int((deadline - time.monotonic()) * 1000)
                more = self._read({ko: ">"}, self.config.batch - len(objects), wait if wait >= 1 else None)
                if not more or not more[0][1]:
                    if wait < 1:
                        break
                    continue
                objects += more[0][1]
            self.counters["objects_entries_read"] += len(objects)
            self._process_objects(objects)
        return bool(got)

    def _apply_query_ops(self, entries: list) -> None:
        """Apply query operations in order (consecutive registrations in one vectorised call),
        then acknowledge them with their rejects."""
        rt = self.runtime
        rejects: list = []
        batch: list = []  # consecutive registrations: (entry id, fields, op)
        queued: set[str] = set()  # their ids

        def flush() -> None:
            if not batch:
                return
            try:
                rt.register_queries([(op.id, op.lon, op.lat, op.keywords, op.k) for _, _, op in batch])
                done = batch
            except InvalidQueryError:  # validated by the parser already; find the culprit one by one
                done = []
                for eid, fields, op in batch:
                    try:
                        rt.register_query(op.id, op.lon, op.lat, op.keywords, op.k)
                        done.append((eid, fields, op))
                    except InvalidQueryError as ex:
                        rejects.append((eid, fields, Rejected("no_keywords", str(ex))))
            for _, _, op in done:
                self.specs[op.id] = _spec(op.lon, op.lat, op.keywords, op.k)
            self.counters["registered"] += len(done)
            batch.clear()
            queued.clear()

        for eid, fields in entries:
            try:
                op = parse_query_op(fields)
            except Rejected as r:
                rejects.append((eid, fields, r))
                continue
            if op.op == "unregister" or op.id in queued:
                flush()
            if op.op == "unregister":
                self.specs.pop(op.id, None)
                self.counters["unregistered" if rt.unregister_query(op.id) else "unregister_unknown"] += 1
                continue
            if op.id in rt.query_worker:
                if self.specs.get(op.id) == _spec(op.lon, op.lat, op.keywords, op.k):
                    self.counters["unchanged"] += 1
                    continue
                rt.unregister_query(op.id)
                self.counters["updated"] += 1
            batch.append((eid, fields, op))
            queued.add(op.id)
        flush()
        self._ack(self.keys.ingest_queries, [e for e, _ in entries], rejects)

    def _process_objects(self, entries: list) -> None:
        """Parse, reject, process one batch on the workers, then acknowledge it."""
        rt = self.runtime
        t0 = time.perf_counter()
        parsed, rejects, in_batch = [], [], set()
        for eid, fields in entries:
            try:
                o = parse_object(eid, fields)
                if o.id in rt.seen or o.id in in_batch:
                    raise Rejected("duplicate_id", f"id={o.id}")
                in_batch.add(o.id)
                parsed.append(o)
            except Rejected as r:
                rejects.append((eid, fields, r))
        table = _objects_table(parsed)
        t1 = time.perf_counter()
        row = rt.process(table) if parsed else None
        t2 = time.perf_counter()
        ids = [e for e, _ in entries]
        record = {"first": ids[0], "last": ids[-1], "n": len(ids), "objects": len(parsed), "rejects": len(rejects),
                  "done_ms": f"{time.time() * 1000:.1f}", "parse_ms": f"{(t1 - t0) * 1e3:.2f}",
                  "update_ms": f"{(t2 - t1) * 1e3:.2f}"}
        self._ack(self.keys.ingest_objects, ids, rejects, record)
        acked_ms = time.time() * 1000
        self.latencies.append(acked_ms - np.array([entry_time_ms(e) for e in ids], dtype=np.float64))
        self.counters["objects"] += len(parsed)
        self.counters["batches"] += 1
        if row is not None:
            self.busy_ms += np.asarray(row["busy_ms"])

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What ``knnmon status`` shows of the running service (see :mod:`knnmon.coordinator.status`)."""
        rt = self.runtime
        lat = np.concatenate(list(self.latencies)) if self.latencies else np.zeros(0)
        return {
            "pid": os.getpid(), "host": socket.gethostname(), "started_ms": self.started_ms,
            "heartbeat_ms": int(time.time() * 1000), "stopping": self.stopping,
            "config": {k: v for k, v in asdict(self.config).items() if k != "redis_url"},
            "workers": self.config.workers, "algorithm": self.config.algorithm,
            "queries_per_worker": rt.worker_queries.tolist() if rt else [],
            "predicted_load_per_worker": rt.worker_loads.round(6).tolist() if rt else [],
            "busy_ms_per_worker": self.busy_ms.round(1).tolist(), "worker_nodes": self.nodes,
            "latency_ms_p50": float(np.percentile(lat, 50)) if len(lat) else None,
            "latency_ms_p99": float(np.percentile(lat, 99)) if len(lat) else None,
            **self.counters,
        }

    def _publish_status(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < 1.0:
            return
        self._status_at = now
        try:
            self.client.set(self.keys.serve_status, json.dumps(self.status()))
        except (redis.ConnectionError, redis.TimeoutError) as ex:
            log.warning("could not publish status: %s", ex)

    # -- stop --------------------------------------------------------------------------------
    def _drop_workers(self) -> None:
        """Stop the workers and close the Redis client (the embedded server stays up)."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def close(self) -> None:
        """Stop the workers and the embedded Redis (saved); idempotent."""
        self._drop_workers()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _objects_table(objects: list[ObjectEntry]) -> pa.Table:
    return pa.table({"id": [o.id for o in objects], "lon": [o.lon for o in objects], "lat": [o.lat for o in objects],
                     "t": [o.t for o in objects], "keywords": [list(o.keywords) for o in objects]},
                    schema=_OBJECT_SCHEMA)




def _ray_running() -> bool:
    import sys

    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _spec(lon: float, lat: float, keywords, k: int) -> tuple:
    """A query's parameters, comparable: a register with equal ones changes nothing."""
    return float(lon), float(lat), tuple(sorted(keywords)), int(k)


def _is_connection_failure(ex: BaseException) -> bool:
    """Whether ``ex`` (or what it wraps, e.g. a Ray task error) is Redis being unreachable."""
    seen = 0
    while ex is not None and seen < 10:
        if isinstance(ex, (StoreUnavailableError, redis.ConnectionError, redis.TimeoutError)):
            return True
        cause = getattr(ex, "cause", None)
        ex = cause if isinstance(cause, BaseException) else (ex.__cause__ or ex.__context__)
        seen += 1
    return False
