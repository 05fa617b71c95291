"""The service loop of ``knnmon serve``: read the ingest streams, apply, acknowledge, repeat.

Clients add entries to two Redis streams (the stream protocol,
:mod:`knnmon.protocol`): ``knn:ingest:queries`` (register / unregister) and
``knn:ingest:objects``. The service reads them as consumer ``serve`` of the consumer group
``knnmon`` and

- applies query operations one by one: a register of an id that exists with other parameters
  is an **update** (unregister, then register: a new result whose version restarts at 0; counted
  as ``updated``), with the same parameters a no-op (``unchanged``: a retried client, or an
  operation applied again after a restart); an unregister of an unknown id is a no-op, counted
  as ``unregister_unknown``;
- processes objects in **batches** formed by the batching policy
  (:mod:`~knnmon.coordinator.service.batching`): by default an object arriving at an idle
  service is processed at once, and a batch is what queued while the previous one ran, up to
  ``batch`` (Fischer & Kossmann, ICDE 2005, "batching pays under load"); each (mini)batch is
  acknowledged, its results released, before the next one runs;
- rejects malformed entries, an object whose id was seen before (``duplicate_id``: the first
  one counts), and an object from the future (``future``: its ``t`` leads its entry id's time, or
  that time leads Redis's clock, by more than ``--max-future``) into ``knn:ingest:rejects``; a
  ``future`` entry also leaves the objects stream, so that recovery never reads it again;
- acknowledges entries only after their effect is in Redis
  (:mod:`~knnmon.coordinator.service.acks`), and logs each batch to ``knn:serve:batches``
  (``first``, ``last`` entry ids, ``n``, ``done_ms``, and ``lat_hist``: its objects' response
  times from XADD to their results written -- each object's own part with ``--release-groups``,
  else the minibatch's end -- :mod:`~knnmon.coordinator.service.latency`).

At start, and whenever Redis went away mid-stream (retried with backoff, logged), the state is
rebuilt from Redis (:mod:`~knnmon.coordinator.service.recovery`): nothing acknowledged is lost
or duplicated, even after SIGKILL. SIGTERM (or Ctrl-C) lets the batch in flight finish and be
acknowledged, then stops cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import redis
from redis.cluster import RedisCluster

from knnmon.connection import connect, redact
from knnmon.coordinator.runtime.preparation import check_objects_not_future
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.service import status as service_status
from knnmon.coordinator.service.acks import acknowledge
from knnmon.coordinator.service.checkpoint import Checkpointer
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service import latency
from knnmon.coordinator.service.batching import BatchPolicy
from knnmon.protocol import (GROUP, entry_order, entry_time_ms, parse_object, parse_query_op,
                                                  redis_clock_ms)
from knnmon.coordinator.service.recovery import OBJECT_SCHEMA, objects_table, recover
from knnmon.errors import KnnmonError, Rejected, StoreUnavailableError, WorkerLostError
from knnmon.keys import Keys
from knnmon.query import Query
from knnmon.store import Store, open_store

__all__ = ["COUNTERS", "Service"]

log = logging.getLogger("knnmon.serve")

#: What the service counts (:attr:`Service.counters`, published in its status).
#: In a Redis Cluster, the longest an idle service blocks on the objects stream alone (ms).
CLUSTER_BLOCK_MS = 100

COUNTERS = ("objects", "batches", "rejects", "registered", "updated", "unchanged", "unregistered",
            "unregister_unknown", "recoveries", "worker_restarts", "isolations", "internal_errors",
            "objects_entries_read", "queries_entries_read", "late", "future", "checkpoints", "entries_trimmed")


class Service:
    """The service (module docstring). ``start()``, then ``run()``; ``close()`` at the end.

    Attributes
    ----------
    counters : dict of int
        :data:`COUNTERS`.
    rejects_by_reason : dict of str to int
        Entries rejected since start, by reason (:data:`~knnmon.errors.REJECT_REASONS`).
    queries : dict of str to Query
        Every registered query.
    """

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.keys = Keys(config.store.namespace)
        self._exit = contextlib.ExitStack()
        self.store: Store | None = None
        self.client: redis.Redis | None = None
        self.runtime: Runtime | None = None
        self.stopping = False
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.rejects_by_reason: dict[str, int] = {}
        self.busy_ms = np.zeros(config.workers)
        self.latencies: deque[np.ndarray] = deque(maxlen=1000)  # per batch: XADD -> acknowledged, ms
        self.started_ms = int(time.time() * 1000)
        self.workers: list[dict[str, Any]] = []  # worker, node, pid of each worker
        self.queries: dict[str, Query] = {}
        self._model = None
        self._preload: pa.Table | None = None
        self._status_at = 0.0
        self._handle_signals = False
        self._revived_seen = 0  # the runtime's workers_revived when the worker list was taken
        self.checkpointer: Checkpointer | None = None
        self._backlog = False  # the last read came back full
        self.batching = BatchPolicy(config.batching, batch=config.batch, max_delay_ms=config.max_delay_ms,
                                    latency_target_ms=config.latency_target_ms, sjf=config.sjf)

    @property
    def redis_url(self) -> str | None:
        return self.store.url if self.store is not None else None

    # -- start and recovery ------------------------------------------------------------------
    def start(self) -> Service:
        """Start (or attach to) Redis, recover the state it holds, start the workers.

        Raises
        ------
        KnnmonError
            Another service runs in this namespace of this Redis (its status is fresh and, on
            this host, its process lives).
        """
        self._refuse_a_second_service()  # before opening the store: a refused start touches nothing
        try:
            self.store = self._exit.enter_context(open_store(self.config.store))
            self._load_preload()
            self._recover()
        except BaseException:
            self._drop_workers()
            self._exit.close()  # a refused start (e.g. a poisoned watermark) leaves no server running
            raise
        return self

    def _refuse_a_second_service(self) -> None:
        url = self.config.store.live_url()
        if url is None:
            return  # no server yet: no service either
        client = connect(url)
        try:
            other = service_status.running_service(client, self.keys)
        except (redis.ConnectionError, redis.TimeoutError):
            other = None  # Redis away: start() waits for it and recovers
        finally:
            client.close()
        if other is not None:
            raise KnnmonError(f"a knnmon serve (pid {other.get('pid')} on {other.get('host')}) is running in namespace "
                              f"{self.config.store.namespace!r} of this Redis; stop it first, or use another --namespace")

    def _load_preload(self) -> None:
        from knnmon.assignment import LoadModel
        from knnmon.ingest.reading import OBJECT_COLUMNS, read_objects, stream_order

        if self.config.objects_dir:
            self._model = LoadModel.from_ingest(self.config.objects_dir)
            table = stream_order(read_objects(self.config.objects_dir, OBJECT_COLUMNS), None).cast(OBJECT_SCHEMA)
            n = table.num_rows if self.config.initial is None else min(self.config.initial, table.num_rows)
            self._preload = table.slice(0, n)
            check_objects_not_future(self._preload, self.config.limits.max_future_ms,
                                     "the preloaded objects (--objects)")
        else:
            self._model = LoadModel.uniform()
            self._preload = OBJECT_SCHEMA.empty_table()

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
                    raise StoreUnavailableError(f"Redis at {redact(self.redis_url)} unreachable while stopping") from ex
                log.warning("Redis at %s unreachable (%s); retrying in %.1f s", redact(self.redis_url), ex, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _recover(self, skip: frozenset[str] = frozenset()) -> None:
        """Rebuild the state from Redis and the ingest streams, then start the workers on it;
        entries ``skip`` of the objects stream are left out and left pending."""
        t0 = time.perf_counter()
        self.client = self._connect()
        # The initial kNN forks helper processes, which is unsafe once Ray's threads run here
        # (a restart while connected to a cluster): then it searches in this process only.
        processes = 1 if _ray_running() else self.config.processes
        run_config = self.config.run_config(self.redis_url)
        r = recover(self.client, self.redis_url, self.config.store.namespace, self._preload, self._model,
                    processes=processes, limits=self.config.limits, skip=skip, window=self.config.window,
                    reserve=run_config.places_reserved, allowed_lateness=self.config.allowed_lateness)
        self.counters["objects_entries_read"] = r.objects_entries_read
        self.counters["queries_entries_read"] = r.queries_entries_read
        self.runtime = Runtime(None, None, run_config, r.prepared, resume=True).start()
        self.queries = r.queries
        if self.config.window is not None:
            self.checkpointer = Checkpointer(self.client, self.redis_url, self.keys, self.config.checkpoint_interval_s)
            for first, last, top in r.spans:
                self.checkpointer.add(first, last, top)
        self._ack(self.keys.ingest_objects, r.pending, r.rejects)
        self.busy_ms = np.zeros(self.config.workers)
        self._take_worker_list()
        log.info("recovered %d queries over %d objects (%d entries re-acknowledged) in %.1f s", len(r.queries),
                 r.prepared.initial.num_rows, len(r.pending), time.perf_counter() - t0)
        self._publish_status(force=True)

    def _take_worker_list(self) -> None:
        """Each worker's number, node and process id, for the status (one call per worker: taken
        when the workers start or one is revived, not per status)."""
        self.workers = [{k: s.get(k) for k in ("worker", "node", "pid")} for s in self.runtime.registrar.stats()]
        self._revived_seen = self.runtime.workers_revived

    def _ack(self, key: str, ids: list[str], rejects: list, batch_record: dict[str, Any] | None = None) -> None:
        # A `future` entry leaves the objects stream with its acknowledgement: recovery re-reads
        # the stream, and Redis's clock will have caught up with an entry id from the future.
        gone = [eid for eid, _, r in rejects if r.reason == "future"] if key == self.keys.ingest_objects else []
        acknowledge(self.client, self.redis_url, self.keys, key, ids, rejects, batch_record, delete=gone)
        self.counters["rejects"] += len(rejects)
        self.counters["objects_entries_read"] -= len(gone)  # the stream's length no longer counts them
        for _, _, r in rejects:
            self.rejects_by_reason[r.reason] = self.rejects_by_reason.get(r.reason, 0) + 1
        self.counters["future"] += len(gone)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, *, max_batches: int | None = None, idle_exit_s: float | None = None,
            handle_signals: bool = True) -> dict[str, int]:
        """Serve until SIGTERM/SIGINT (or :meth:`stop`); returns the counters.

        ``max_batches`` and ``idle_exit_s`` (stop after that many seconds with nothing to do)
        bound a run for tests and benchmarks; ``handle_signals=False`` leaves the process's
        signal handlers alone (a service embedded in another program). Redis going away, or a
        worker lost: retried with backoff, logged, then the state is recovered from Redis
        (nothing acknowledged is lost).
        """
        self._handle_signals = handle_signals
        if handle_signals:
            self._install_signals()
        self._apply_pending_query_ops()
        idle_since = time.monotonic()
        failures = 0
        stale = False  # work done since the status was last published
        while not self.stopping:
            try:
                did = self._step()
                failures = 0
            except Exception as ex:  # noqa: BLE001 - Redis or a worker gone: recover, or give up after 10
                failures += 1
                if failures > 10 or not _is_infrastructure(ex):
                    raise
                if _caused_by(ex, WorkerLostError):
                    self.counters["worker_restarts"] += 1
                log.warning("step failed (%s: %s); recovering from Redis (attempt %d)", type(ex).__name__, ex,
                            failures)
                self._restart()
                continue
            if did:
                idle_since = time.monotonic()
                stale = True
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
            if max_batches is not None and self.counters["batches"] >= max_batches:
                break
            self._publish_status(force=stale and not did)  # at once when the work runs out
            stale = stale and did
        self.stopping = True  # the loop is over: the last status says so
        self._publish_status(force=True)
        return dict(self.counters)

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish the batch in flight and return."""
        if not self.stopping:
            log.info("stopping: finishing the batch in flight")
        self.stopping = True

    def _install_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)

    def _restart(self, skip: frozenset[str] = frozenset()) -> None:
        """Drop the workers and rebuild everything from Redis, leaving the entries ``skip`` (of
        either stream) pending for the caller."""
        self.counters["recoveries"] += 1
        self._drop_workers()
        time.sleep(0.5)
        self._recover(skip)
        if self._handle_signals:
            self._install_signals()  # a Ray instance started anew installs its own SIGTERM handler
        self._apply_pending_query_ops(skip)

    def _read(self, streams: dict[str, str], count: int, block_ms: int | None) -> list:
        """XREADGROUP; an entry deleted while pending comes back with no fields (``{}``: rejected
        by the parser). In a Redis Cluster the streams hash to different slots, so one
        XREADGROUP each: without blocking, then, if all were empty, blocking on the last one
        (the objects stream) for at most :data:`CLUSTER_BLOCK_MS` (a query operation arriving
        meanwhile waits that long)."""
        if len(streams) == 1 or not isinstance(self.client, RedisCluster):
            got = self.client.xreadgroup(GROUP, self.config.consumer, streams, count=count, block=block_ms) or []
        else:
            got = [x for key, start in streams.items()
                   for x in self.client.xreadgroup(GROUP, self.config.consumer, {key: start}, count=count) or []
                   if x[1]]
            if not got and block_ms is not None:
                key, start = list(streams.items())[-1]
                got = self.client.xreadgroup(GROUP, self.config.consumer, {key: start}, count=count,
                                             block=min(block_ms, CLUSTER_BLOCK_MS)) or []
        return [(key, [(eid, fields or {}) for eid, fields in entries]) for key, entries in got]

    def _apply_pending_query_ops(self, skip: frozenset[str] = frozenset()) -> None:
        """Re-apply query operations delivered before a restart but never acknowledged (but
        those in ``skip``)."""
        kq, start = self.keys.ingest_queries, "0"
        while True:
            got = self._read({kq: start}, 1000, None)
            entries = got[0][1] if got else []
            if not entries:
                return
            start = entries[-1][0]
            todo = [e for e in entries if e[0] not in skip]
            if todo:
                self._guarded(kq, todo, self._apply_query_ops)

    def _guarded(self, stream: str, entries: list, apply: Callable[[list], None]) -> None:
        """``apply(entries)``, with poison isolation: a failure that is not Redis or a worker
        going away (so a bug that an entry triggered) cannot stop the service. The state is
        rebuilt from Redis without these entries, which are then applied one at a time; one
        that fails alone is rejected as ``internal_error`` with the error, and acknowledged."""
        try:
            apply(entries)
            return
        except Exception as ex:  # noqa: BLE001 - isolated below
            if _is_infrastructure(ex):
                raise
            log.error("applying %d entries of %s failed (%s: %s); rebuilding from Redis and applying them one "
                      "by one", len(entries), stream, type(ex).__name__, ex)
        self.counters["isolations"] += 1
        self._restart(skip=frozenset(e for e, _ in entries))
        for i, (eid, fields) in enumerate(entries):
            try:
                apply([(eid, fields)])
            except Exception as ex:  # noqa: BLE001 - this entry alone fails: it is rejected
                if _is_infrastructure(ex):
                    raise
                self.counters["internal_errors"] += 1
                detail = f"{type(ex).__name__}: {ex}"[:1000]
                log.error("entry %s of %s rejected as internal_error: %s", eid, stream, detail)
                self._restart(skip=frozenset(e for e, _ in entries[i:]))
                self._ack(stream, [eid], [(eid, fields, Rejected("internal_error", detail))])

    def _step(self) -> bool:
        """One read of both streams; query operations applied, objects batched. ``True`` if
        anything was done."""
        ko, kq = self.keys.ingest_objects, self.keys.ingest_queries
        got = self._read({kq: ">", ko: ">"}, self.batching.read_count, self.config.block_ms)
        objects: list = []
        for key, entries in got:
            if key == kq:
                self.counters["queries_entries_read"] += len(entries)
                restarts = self.counters["recoveries"]
                self._guarded(kq, entries, self._apply_query_ops)
                if self.counters["recoveries"] != restarts:
                    # Rebuilt from Redis meanwhile: the objects read with these entries were
                    # delivered, so the recovery applied and acknowledged them already.
                    objects = []
                    break
            else:
                objects += entries
        if objects:
            deadline = time.monotonic() + self.batching.wait_ms / 1000
            while len(objects) < self.config.batch and self.batching.wait_ms > 0:
                wait = int((deadline - time.monotonic()) * 1000)
                more = self._read({ko: ">"}, self.config.batch - len(objects), wait if wait >= 1 else None)
                if not more or not more[0][1]:
                    if wait < 1:
                        break
                    continue
                objects += more[0][1]
            self.counters["objects_entries_read"] += len(objects)
            self.batching.read(len(objects))
            self._backlog = len(objects) >= self.batching.read_count
            self._guarded(ko, objects, self._process_objects)
        return bool(got)

    def _apply_query_ops(self, entries: list) -> None:
        """Apply query operations in order (consecutive registrations in one vectorised call),
        then acknowledge them with their rejects."""
        registrar = self.runtime.registrar
        rejects: list = []
        batch: list = []  # consecutive registrations: (entry id, fields, query)
        queued: set[str] = set()  # their ids

        def flush() -> None:
            if not batch:
                return
            registrar.register([q for _, _, q in batch])
            for _, _, q in batch:
                self.queries[q.id] = q
            self.counters["registered"] += len(batch)
            batch.clear()
            queued.clear()

        for eid, fields in entries:
            try:
                op = parse_query_op(fields, self.config.limits)
            except Rejected as r:
                rejects.append((eid, fields, r))
                continue
            if op.op == "unregister" or op.id in queued:
                flush()
            if op.op == "unregister":
                self.queries.pop(op.id, None)
                self.counters["unregistered" if registrar.unregister(op.id) else "unregister_unknown"] += 1
                continue
            if op.id in registrar.query_worker:
                if self.queries.get(op.id) == op.query:
                    self.counters["unchanged"] += 1
                    continue
                registrar.unregister(op.id)
                self.counters["updated"] += 1
            batch.append((eid, fields, op.query))
            queued.add(op.id)
        flush()
        self._ack(self.keys.ingest_queries, [e for e, _ in entries], rejects)
        self.runtime.upkeep_routing()  # unregistered queries' routing entries go in time

    def _process_objects(self, entries: list) -> None:
        """Parse and reject a read's entries, then process its objects in the minibatches the
        batching policy cuts (:mod:`~knnmon.coordinator.service.batching`), each acknowledged
        (its results released) before the next runs; rejects go with the first."""
        rt = self.runtime
        t0 = time.perf_counter()
        parsed, sources, rejects, in_batch = [], [], [], set()
        clock = redis_clock_ms(self.client) if self.config.limits.max_future_ms is not None else None
        for eid, fields in entries:
            try:
                o = parse_object(eid, fields, self.config.limits, clock_ms=clock)
                if o.id in rt.dispatcher.seen or o.id in in_batch:
                    raise Rejected("duplicate_id", f"id={o.id}")
                in_batch.add(o.id)
                parsed.append(o)
                sources.append((eid, fields))
            except Rejected as r:
                rejects.append((eid, fields, r))
        window = rt.dispatcher.window
        if window is not None and parsed:  # late: expired at the watermark this batch moves to
            cutoff = window.cutoff_after([o.t for o in parsed])
            late = [(eid, fields, o) for (eid, fields), o in zip(sources, parsed) if o.t <= cutoff]
            if late:
                keep = [o.t > cutoff for o in parsed]
                parsed = [o for o, k in zip(parsed, keep) if k]
                sources = [e for e, k in zip(sources, keep) if k]
                why = " (watermark: the largest t - the allowed lateness)" if window.lateness_ms else ""
                rejects += [(eid, fields, Rejected("late", f"t={o.t} <= watermark - window = {cutoff}{why}"))
                            for eid, fields, o in late]
                self.counters["late"] += len(late)
        table = objects_table(parsed)
        parse_ms = (time.perf_counter() - t0) * 1e3
        sjf = self.batching.sjf and window is None and self.batching.splits(len(parsed), backlog=self._backlog)
        parts = self.batching.cut(rt.dispatcher.workload(table) if sjf else np.zeros(len(parsed), np.int64), sjf=sjf,
                                  backlog=self._backlog)
        rejected = [e for e, _, _ in rejects]
        if not parts:
            self._finish([], rejected, rejects, None, parse_ms, 0.0, None)
        times = table.column("t").to_numpy()
        for i, part in enumerate(parts):
            t1 = time.perf_counter()
            report = rt.process(table.take(pa.array(part)))
            update_ms = (time.perf_counter() - t1) * 1e3
            ids = [sources[j][0] for j in part.tolist()]
            self._finish(ids, rejected if i == 0 else [], rejects if i == 0 else [], report,
                         parse_ms if i == 0 else 0.0, update_ms, int(times[part].max()))
            self.batching.observe(len(part), time.perf_counter() - t1)

    def _finish(self, ids: list[str], rejected: list[str], rejects: list, report, parse_ms: float, update_ms: float,
                top_t: int | None) -> None:
        """Acknowledge one minibatch's objects' entries ``ids`` (and the read's rejected entries,
        with its first), with its batch record; then checkpoint when due and count. ``top_t``:
        the largest time of its objects (``None``: none)."""
        n_objects = len(ids)
        rt = self.runtime
        now_ms = time.time() * 1000
        acked = sorted(ids + rejected, key=entry_order)
        # an entry id from the future (within --max-future) counts no negative response time
        published_ms = np.minimum(np.array([entry_time_ms(e) for e in ids], dtype=np.float64), now_ms)
        done_ms = np.full(len(ids), now_ms)
        released = report.released_ms if report is not None else None
        if released is not None and len(released) == len(ids):  # workers released in parts
            done_ms = np.where(np.isfinite(released), np.minimum(released, now_ms), now_ms)
        lat = done_ms - published_ms
        record = {"first": acked[0], "last": acked[-1], "n": len(acked), "objects": n_objects,
                  "rejects": len(rejects), "done_ms": f"{now_ms:.1f}", "parse_ms": f"{parse_ms:.2f}",
                  "update_ms": f"{update_ms:.2f}", "lat_hist": latency.encode(lat)}
        if report is not None:  # what the batch cost: its deliveries, candidates, changes, refills
            record.update(deliveries=report.deliveries, candidates=report.candidates, changed=report.changed,
                          refilled=report.refilled, refill_ms=f"{report.refill_ms:.2f}",
                          redis_ms=f"{report.redis_server_ms:.2f}",
                          **{f"refill_{k}_ms": f"{v:.2f}" for k, v in rt.dispatcher.refill_parts_ms.items()})
        self._ack(self.keys.ingest_objects, acked, rejects, record)
        if self.checkpointer is not None:
            self.checkpointer.add(acked[0], acked[-1], top_t)
            if self.checkpointer.due():
                self._checkpoint()
        acked_ms = time.time() * 1000
        if ids:
            self.latencies.append(acked_ms - published_ms)
        self.counters["objects"] += n_objects
        self.counters["batches"] += 1
        if report is not None:
            self.busy_ms += np.asarray(report.busy_ms)
        if rt.workers_revived != self._revived_seen:  # a worker came back: its process changed
            self._take_worker_list()

    def _checkpoint(self) -> None:
        """Trim the objects stream below what the window needs; record the checkpoint."""
        window = self.runtime.dispatcher.window
        self.counters["entries_trimmed"] += self.checkpointer.checkpoint(window.watermark, window.cutoff)
        self.counters["checkpoints"] += 1

    # -- status ------------------------------------------------------------------------------
    def _publish_status(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < 1.0:
            return
        self._status_at = now
        service_status.publish(self)

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
        """Stop the workers and the embedded Redis (saved); idempotent. The last status says
        the service stopped, so that a new one may start at once."""
        if self.client is not None and not self.stopping:
            self.stopping = True
            service_status.publish(self)
        self._drop_workers()
        self._exit.close()

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _ray_running() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _caused_by(ex: BaseException | None, kinds: type | tuple[type, ...]) -> bool:
    """Whether ``ex`` or what it wraps (a Ray task error's ``cause``, ``__cause__``,
    ``__context__``) is one of ``kinds``."""
    seen = 0
    while ex is not None and seen < 10:
        if isinstance(ex, kinds):
            return True
        cause = getattr(ex, "cause", None)
        ex = cause if isinstance(cause, BaseException) else (ex.__cause__ or ex.__context__)
        seen += 1
    return False


def _is_infrastructure(ex: BaseException) -> bool:
    """Redis unreachable or a worker lost: recovered from Redis, never blamed on an entry."""
    return _caused_by(ex, (StoreUnavailableError, redis.ConnectionError, redis.TimeoutError, WorkerLostError))
