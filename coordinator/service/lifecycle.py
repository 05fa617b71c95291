"""The service's lifecycle: its state, start (Redis, recovery, the workers), rebuild after a
fault, the status it publishes, and stop. :class:`~knnmon.coordinator.service.loop.Service` is
built with one and runs the loop that serves over it."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Self

import pyarrow as pa
import redis

from knnmon.coordinator.rebalance.rebalancer import Rebalancer
from knnmon.coordinator.recovery.kept_start import KeptStart
from knnmon.coordinator.recovery.reviver import Reviver
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.reports import WorkerStats
from knnmon.coordinator.recovery.stored_start import NotResumableError
from knnmon.coordinator.runtime.worker_pool import make_pool
from knnmon.coordinator.service import status as service_status
from knnmon.coordinator.service.batching import BatchPolicy
from knnmon.coordinator.recovery.checkpoint import Checkpointer
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.intake import StreamReader
from knnmon.coordinator.service.ledger import Ledger
from knnmon.coordinator.recovery.outage import connect_when_up, server_ids
from knnmon.coordinator.service.query_ops import QueryOps
from knnmon.coordinator.recovery.rebuild import Recovered, recover as recover_state
from knnmon.coordinator.recovery.resume import record_settings, settings_of
from knnmon.coordinator.service.telemetry import ServiceTelemetry
from knnmon.coordinator.service.probes import ProbeServer
from knnmon.coordinator.service.startup import load_preload, ray_running, refuse_a_second_service
from knnmon.connection import set_retry_window
from knnmon.heap import bulk_build, give_back
from knnmon.keys import Keys
from knnmon.store import Store, open_store

__all__ = ["COUNTERS", "Lifecycle"]

log = logging.getLogger("knnmon.serve")

#: What the service counts (:attr:`Lifecycle.counters`, published in its status).
COUNTERS = ("objects", "batches", "rejects", "registered", "updated", "unchanged", "unregistered",
            "unregister_unknown", "recoveries", "worker_restarts", "isolations", "internal_errors",
            "objects_entries_read", "queries_entries_read", "late", "future", "checkpoints", "entries_trimmed",
            "redis_outages", "result_changes", "refilled")


class Lifecycle:
    """The service's state, start, recovery, status and stop (module docstring): ``start()``,
    then the loop (:meth:`Service.run`), then ``close()``.

    Attributes
    ----------
    counters : dict of int
        :data:`COUNTERS`.
    ledger : Ledger
        Acknowledgements and what they count (rejects by reason, response times, busy time).
    query_ops : QueryOps
        The registered queries (``query_ops.queries``) and the rule applied to each operation.
    telemetry : ServiceTelemetry
        Its metrics and readiness; served by :attr:`probes` (with ``config.metrics``).
    serving : bool
        The state is recovered and the workers started (``False`` while recovering).
    stopping : bool
        The loop finishes the batch in flight and returns (set by :meth:`Service.stop`).
    recovered_from : frozenset of str or None
        The Redis server(s) the state was recovered from (their run ids:
        :func:`~knnmon.coordinator.recovery.outage.server_ids`), or the ones found since to have
        kept every write.
    """

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.keys = Keys(config.run.store.namespace)
        self._exit = contextlib.ExitStack()
        self.store: Store | None = None
        self.client: redis.Redis | None = None
        self.runtime: Runtime | None = None
        self.reader: StreamReader | None = None
        self.stopping = False
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.telemetry = ServiceTelemetry(self, config.ready_max_lag)
        self.ledger = Ledger(self.keys, self.counters, config.run.workers, self.telemetry.metrics)
        self.query_ops = QueryOps({}, config.run.limits, self.counters)
        self.started_ms = int(time.time() * 1000)
        self.workers: list[WorkerStats] = []  # (their worker, node and pid: the status's)
        self._model = None
        self._preload: pa.Table | None = None
        self._status_at = 0.0
        self._replan = config.replan  # the next start recovers in full
        #: The runtime's ``workers_revived`` when the worker list was last taken and published
        #: (``/readyz`` waits for it: a revival is over once the status shows it).
        self.revivals_published = 0
        self.recovered_from: frozenset[str] | None = None
        self.serving = False
        self.probes: ProbeServer | None = None
        self.batching = BatchPolicy(config.batching, batch=config.run.batch, max_delay_ms=config.max_delay_ms,
                                    latency_target_ms=config.latency_target_ms)

    @property
    def redis_url(self) -> str | None:
        return self.store.url if self.store is not None else None

    @property
    def queries(self) -> dict:
        """Every registered query by id."""
        return self.query_ops.queries

    # -- start and recovery ------------------------------------------------------------------
    def start(self) -> Self:
        """Start (or attach to) Redis, recover the state it holds, start the workers.

        Raises
        ------
        KnnmonError
            Another service runs in this namespace of this Redis (its status is fresh and, on
            this host, its process lives).
        """
        refuse_a_second_service(self.config, self.keys)  # before opening the store: a refused start touches nothing
        if self.config.metrics is not None:  # (a taken port fails the start before anything runs)
            t = self.telemetry
            self.probes = ProbeServer(self.config.metrics, t.metrics.registry, t.readiness).start()
            self._exit.callback(self.probes.stop)
            self._exit.callback(t.close)
        try:
            self.store = self._exit.enter_context(open_store(self.config.run.store))
            self._exit.callback(service_status.Heartbeat(self.store.url, self.keys).stop)
            self._model, self._preload = load_preload(self.config)
            self.recover()
        except BaseException:
            self.drop_workers()
            self._exit.close()  # a refused start (e.g. a poisoned watermark) leaves no server running
            raise
        return self

    def recover(self, skip: frozenset[str] = frozenset()) -> None:
        """Rebuild the state from Redis and the ingest streams, then start the workers on it;
        entries ``skip`` of the objects stream are left out and left pending. The workers start
        from the results Redis holds when :mod:`~knnmon.coordinator.recovery.resume` allows."""
        t0 = time.perf_counter()
        set_retry_window(self.config.run.redis_wait_s)
        self.client = connect_when_up(self.redis_url, lambda: self.stopping)
        self.recovered_from = server_ids(self.client)
        self.reader = StreamReader(self.client, self.config.consumer)
        settings = settings_of(self.config, self._preload.num_rows)
        try:
            replan, self._replan = self._replan, False  # (serve.replan: the first start only)
            r, pool_s, started_s = self.start_runtime(skip, None if replan else settings)
        except NotResumableError as ex:
            log.warning("starting the workers from the results Redis holds failed (%s): recovering in full", ex)
            r, pool_s, started_s = self.start_runtime(skip, None)
        record_settings(self.client, self.keys, settings, self.redis_url)
        give_back()  # what the collection at the block's end freed
        self.query_ops.queries = r.queries
        checkpointer = None
        if self.config.run.window is not None:
            checkpointer = Checkpointer(self.client, self.redis_url, self.keys, self.config.checkpoint_interval_s,
                                        self.config.run.limits)
            for first, last, top in r.spans:
                checkpointer.add(first, last, top)
        ledger = self.ledger
        ledger.connect(self.client, self.redis_url, checkpointer)
        ledger.ack(self.keys.ingest_objects, r.pending, r.rejects)
        self.counters["objects"] += len(r.pending) - len(r.rejects)  # (delivered before, applied by the recovery)
        ledger.reset_busy(self.config.run.workers)
        self.take_worker_list()
        self.revivals_published = self.runtime.workers_revived
        self.telemetry.started()
        self.serving = True
        tm = self.runtime.timings
        kept = "workers kept as they were; " if isinstance(r.stored, KeptStart) else ""
        how = (f"{kept}from the stored results: read {tm.get('stored_read_s', 0.0):.1f} s, objects read meanwhile "
               f"{r.objects_log.seconds:.1f} s (waited {tm.get('objects_wait_s', 0.0):.1f} s), replay "
               f"{tm.get('replay_s', 0.0):.1f} s of {tm.get('replayed', 0)} objects" if r.stored is not None else
               f"{self.runtime.registrar.placements_written} placements rewritten")
        # One after the other: the actors' start, the recovery's steps (a step "a b" is part of
        # step "a"), the runtime's start (plan, load and the rest); what is left is this block's.
        steps = {"actors": pool_s, **{k: v for k, v in r.seconds.items() if " " not in k}, "runtime": started_s}
        total = time.perf_counter() - t0
        log.info("%s %d queries over %d objects (%d entries re-acknowledged) in %.1f s: %s, the rest %.1f s "
                 "(the runtime: plan %.1f s, load %.1f s; %s)",
                 "recovered" if r.queries or r.pending else "started with", len(r.queries),
                 r.prepared.initial.num_rows, len(r.pending), total,
                 ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()), max(0.0, total - sum(steps.values())),
                 tm.get("plan_s", 0.0), tm.get("load_s", 0.0), how)
        self.publish_status(force=True)

    def rebuild(self, skip: frozenset[str] = frozenset()) -> None:
        """Drop the workers and rebuild everything from Redis (:meth:`recover`), leaving the
        entries ``skip`` of the objects stream pending; counted in ``recoveries``."""
        self.counters["recoveries"] += 1
        self.drop_workers()
        time.sleep(0.5)  # (a Redis or a node that just failed: not hammered at once)
        self.recover(skip)

    def start_runtime(self, skip: frozenset[str], settings: dict[str, str] | None) -> tuple[Recovered, float, float]:
        """:func:`~knnmon.coordinator.recovery.rebuild.recover`, then the runtime started on what
        it rebuilt (as :attr:`runtime`); returns the recovery and the seconds to start the
        workers' actors and the runtime."""
        run_config = self.config.run_config(self.redis_url)
        # The workers' processes start (imports, compiled kernels) while this one reads Redis.
        t_pool = time.perf_counter()
        pool = make_pool(run_config, self.redis_url, detach=True)  # (takes its predecessor's actors)
        pool_s = time.perf_counter() - t_pool
        # The initial kNN forks helper processes, which is unsafe once Ray's threads run here:
        # then it searches in this process only.
        processes = 1 if ray_running() else self.config.run.processes
        runtime: Runtime | None = None
        try:
            with bulk_build():  # millions of long-lived objects: no collector passes over them (heap.bulk_build)
                r = recover_state(self.client, self.redis_url, self.config.run.store.namespace, self._preload,
                            self._model, processes=processes, limits=self.config.run.limits, skip=skip,
                            window=self.config.run.window, reserve=run_config.places_reserved,
                            allowed_lateness=self.config.run.allowed_lateness, settings=settings, pool=pool)
                t_start = time.perf_counter()
                runtime = Runtime(None, None, run_config, r.prepared, resume=True, pool=pool, stored=r.stored,
                                  rebalancer=Rebalancer, reviver=Reviver)
                self.runtime = runtime.start()
                self.counters["objects_entries_read"] = r.objects_entries_read  # (the objects read meanwhile)
                self.counters["queries_entries_read"] = r.queries_entries_read
                return r, pool_s, time.perf_counter() - t_start
        except BaseException:
            (runtime or pool).close()  # (the runtime owns the pool once made)
            raise

    def take_worker_list(self) -> None:
        """Each worker's number, node and process id, for the status (one call per worker: taken
        when the workers start or one is revived, not per status)."""
        self.workers = self.runtime.worker_processes()

    def follow_revivals(self) -> None:
        """Take the worker list again if a worker was revived since it was taken (by a batch, a
        query operation or the idle loop's check): the worker's process, and perhaps its node,
        changed. The status is published at once, before ``/readyz`` counts the revival over."""
        if self.runtime is not None and self.runtime.workers_revived != self.revivals_published:
            revived = self.runtime.workers_revived
            self.take_worker_list()
            self.publish_status(force=True)
            self.revivals_published = revived

    # -- status ------------------------------------------------------------------------------
    def publish_status(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < 1.0:
            return
        self._status_at = now
        if self.probes is not None and self.runtime is not None:
            self.telemetry.refresh()
        service_status.publish(self)

    # -- stop --------------------------------------------------------------------------------
    def drop_workers(self) -> None:
        """Stop the workers and close the Redis client (the embedded server stays up)."""
        self.serving = False
        if self.runtime is not None:
            self.telemetry.stopping_runtime()
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
        self.drop_workers()
        self._exit.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
