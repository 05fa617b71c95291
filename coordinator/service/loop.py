"""The service loop of ``knnmon serve``: read the ingest streams, apply, acknowledge, repeat.

Clients add entries to two Redis streams (the stream protocol, :mod:`knnmon.protocol`):
``knn:ingest:queries`` (register / unregister) and ``knn:ingest:objects``. The service reads
them as consumer ``serve`` of the consumer group ``knnmon``
(:mod:`~knnmon.coordinator.service.intake`) and

- applies query operations in order (:mod:`~knnmon.coordinator.service.query_ops`: register,
  update, unregister);
- processes objects in **batches** formed by the batching policy
  (:mod:`~knnmon.coordinator.service.batching`): by default an object arriving at an idle
  service is processed at once, and a batch is what queued while the previous one ran, up to
  ``batch`` (Fischer & Kossmann, ICDE 2005, "batching pays under load"); each (mini)batch is
  acknowledged, its results released, before the next one runs;
- rejects malformed entries, an object whose id was seen before (``duplicate_id``: the first
  one counts), an object from the future (``future``: its ``t`` leads its entry id's time, or
  that time leads Redis's clock, by more than ``--max-future``) and, with a window, a late
  object, into ``knn:ingest:rejects``; a rejected entry leaves its ingest stream (recovery
  never reads it again);
- acknowledges entries only after their effect is in Redis, and logs each batch to
  ``knn:serve:batches`` (:mod:`~knnmon.coordinator.service.ledger`).

At start the state is rebuilt from Redis (:mod:`~knnmon.coordinator.recovery.rebuild`):
nothing acknowledged is lost or duplicated, even after SIGKILL. A worker lost on the way is
revived in place by the runtime (:mod:`~knnmon.coordinator.recovery.revival`). When Redis stops
answering, the service waits for it and goes on without a rebuild if it kept every write
(:mod:`~knnmon.coordinator.recovery.outage`); otherwise, as when a worker cannot be revived, the
state is rebuilt from Redis. An entry whose processing fails
for any other reason is isolated (:meth:`Service._guarded`).

The service is built from its parts: a :class:`~knnmon.coordinator.service.lifecycle.Lifecycle`
(the state, its start, rebuild and stop) and a :class:`~knnmon.coordinator.recovery.watch.Watch`
(Redis's server and the workers, checked between steps); the loop is its own. SIGTERM (or Ctrl-C) lets the batch
in flight finish and be acknowledged, then stops cleanly.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import pyarrow as pa

from knnmon.coordinator.service.intake import Entry, read_objects
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.lifecycle import COUNTERS, Lifecycle
from knnmon.coordinator.recovery.watch import Watch
from knnmon.coordinator.recovery.outage import caused_by, is_infrastructure
from knnmon import termination
from knnmon.errors import Rejected, WorkerLostError
from knnmon.logs import BATCH

__all__ = ["COUNTERS", "Service"]

log = logging.getLogger("knnmon.serve")


class Service:
    """The service (module docstring): :meth:`start`, then :meth:`run`; :meth:`close` at the end.

    Parameters
    ----------
    config
        :class:`~knnmon.coordinator.service.config.ServeConfig`.

    Attributes
    ----------
    life : Lifecycle
        Its state (counters, ledger, queries, the runtime, the Redis client), start, rebuild
        and stop.
    watch : Watch
        Redis's server and the workers' actors, checked between steps.
    """

    def __init__(self, config: ServeConfig) -> None:
        self.life = Lifecycle(config)
        self.watch = Watch(self.life, rebuild=self._restart, catch_up=self._catch_up, applying=lambda: self._applying)
        self._stop_asked = False  # stop() was called (a signal): the next run() returns at once
        self._applying = False  # entries read are being applied: state ahead of what is acknowledged
        self._backlog = False  # the last read came back full

    # -- its parts' faces ----------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """:data:`~knnmon.coordinator.service.lifecycle.COUNTERS`."""
        return self.life.counters

    @property
    def runtime(self):
        """The :class:`~knnmon.coordinator.runtime.runtime.Runtime` (``None`` while recovering)."""
        return self.life.runtime

    def start(self) -> Self:
        """:meth:`Lifecycle.start`."""
        self.life.start()
        return self

    def close(self) -> None:
        """:meth:`Lifecycle.close`."""
        self.life.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

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
        life = self.life
        if handle_signals:
            self._install_signals()
        life.stopping = self._stop_asked  # (a run that ended idle may be followed by another)
        self._apply_pending_query_ops()
        idle_since = time.monotonic()
        failures = 0
        stale = False  # work done since the status was last published
        rebuild = False  # a failure asked for a rebuild from Redis, not yet done
        while not life.stopping:
            try:
                if rebuild:
                    self._restart()  # (it may fail too, Redis going away again: retried as any step)
                    rebuild = False
                did = self._step(wait=not stale)  # (work done: is there more, without waiting?)
                self.watch.server()
                if not did:
                    self.watch.workers()
                life.follow_revivals()
                failures = 0
            except Exception as ex:  # noqa: BLE001 - Redis or a worker gone: recover, or give up after 10
                lost = caused_by(ex, WorkerLostError)
                # (Redis going away is waited out however often: each rebuild waits for it. A
                # worker lost 11 times in a row is not.)
                failures += lost or not rebuild
                if failures > 10 or not is_infrastructure(ex):
                    raise
                if lost:
                    self.counters["worker_restarts"] += 1
                elif not rebuild and not self._applying and self.watch.ride_out(ex):
                    failures = 0  # (Redis came back with every write: progress, however often it restarts)
                    continue
                if life.stopping:  # nothing rebuilt for a service that stops: what is pending stays so
                    log.warning("stopped while Redis or a worker was away (%s: %s); the entries delivered and not "
                                "acknowledged are applied by the next service", type(ex).__name__, ex)
                    break
                log.warning("step failed (%s: %s); recovering from Redis (attempt %d)", type(ex).__name__, ex, failures)
                rebuild = True
                continue
            if did:
                idle_since = time.monotonic()
                stale = True
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
            if max_batches is not None and self.counters["batches"] >= max_batches:
                break
            life.publish_status(force=stale and not did)  # at once when the work runs out
            stale = stale and did
        life.stopping = True  # the loop is over: the last status says so
        life.publish_status(force=True)
        return dict(self.counters)

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish the batch in flight and return."""
        if not self.life.stopping:
            log.info("stopping: finishing the batch in flight")
        self.life.stopping = self._stop_asked = True

    def _install_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
            if termination.asked():  # (a SIGTERM during the start, its SystemExit dropped: knnmon.termination)
                self.stop()

    def _catch_up(self) -> None:
        """Apply what was delivered before Redis went away and never acknowledged (the replies
        lost): pending query operations, then objects (:meth:`Watch.ride_out`)."""
        self._apply_pending_query_ops()
        ko = self.life.keys.ingest_objects
        while entries := (self.life.reader.read({ko: "0"}, self.life.config.run.batch, None) or [(ko, [])])[0][1]:
            self._guarded(ko, entries, self._process_objects)

    def _restart(self, skip: frozenset[str] = frozenset()) -> None:
        """Drop the workers and rebuild everything from Redis (:meth:`Lifecycle.rebuild`),
        leaving the entries ``skip`` (of either stream) pending for the caller."""
        self._applying = False
        self.life.rebuild(skip)
        self._apply_pending_query_ops(skip)

    def _apply_pending_query_ops(self, skip: frozenset[str] = frozenset()) -> None:
        """Re-apply query operations delivered before a restart but never acknowledged (but
        those in ``skip``)."""
        kq, start = self.life.keys.ingest_queries, "0"
        while True:
            got = self.life.reader.read({kq: start}, 1000, None)
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
        that fails alone is rejected as ``internal_error`` with the error, and acknowledged.
        Until it returns the state may be ahead of what is acknowledged (``_applying``)."""
        self._applying = True
        try:
            apply(entries)
            self._applying = False
            return
        except Exception as ex:  # noqa: BLE001 - isolated below
            if is_infrastructure(ex):
                raise
            log.error("applying %d entries of %s failed (%s: %s); rebuilding from Redis and applying them one "
                      "by one", len(entries), stream, type(ex).__name__, ex)
        self.counters["isolations"] += 1
        self._restart(skip=frozenset(e for e, _ in entries))
        for i, (eid, fields) in enumerate(entries):
            try:
                apply([(eid, fields)])
            except Exception as ex:  # noqa: BLE001 - this entry alone fails: it is rejected
                if is_infrastructure(ex):
                    raise
                self.counters["internal_errors"] += 1
                detail = f"{type(ex).__name__}: {ex}"[:1000]
                log.error("entry %s of %s rejected as internal_error: %s", eid, stream, detail)
                self._restart(skip=frozenset(e for e, _ in entries[i:]))
                self.life.ledger.ack(stream, [eid], [(eid, fields, Rejected("internal_error", detail))])
        self._applying = False

    def _step(self, wait: bool = True) -> bool:
        """One read of both streams (``wait``: blocking up to ``block_ms`` for entries);
        query operations applied, objects batched. ``True`` if anything was done."""
        ko, kq = self.life.keys.ingest_objects, self.life.keys.ingest_queries
        reader, batching = self.life.reader, self.life.batching
        got = reader.read({kq: ">", ko: ">"}, batching.batch, self.life.config.block_ms if wait else None)
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
            deadline = time.monotonic() + batching.wait_ms / 1000
            while len(objects) < self.life.config.run.batch and batching.wait_ms > 0:
                wait = int((deadline - time.monotonic()) * 1000)
                more = reader.read({ko: ">"}, self.life.config.run.batch - len(objects), wait if wait >= 1 else None)
                if not more or not more[0][1]:
                    if wait < 1:
                        break
                    continue
                objects += more[0][1]
            self.counters["objects_entries_read"] += len(objects)
            batching.read(len(objects))
            self._backlog = len(objects) >= batching.batch
            self._guarded(ko, objects, self._process_objects)
        return bool(got)

    def _apply_query_ops(self, entries: list[Entry]) -> None:
        """Apply query operations in order, then acknowledge them with their rejects."""
        rejects = self.life.query_ops.apply(entries, self.runtime)
        self.life.ledger.ack(self.life.keys.ingest_queries, [e for e, _ in entries], rejects)
        self.runtime.upkeep_routing()  # unregistered queries' routing entries go in time

    def _process_objects(self, entries: list[Entry]) -> None:
        """Parse and reject a read's entries, then process its objects in the minibatches the
        batching policy cuts (:mod:`~knnmon.coordinator.service.batching`), each acknowledged
        (its results released) before the next runs; rejects go with the first."""
        rt, batching = self.runtime, self.life.batching
        t0 = time.perf_counter()
        read = read_objects(entries, rt, self.life.config.run.limits, self.life.client)
        self.counters["late"] += read.late
        table = read.objects
        parse_ms = (time.perf_counter() - t0) * 1e3
        parts = batching.cut(table.num_rows, backlog=self._backlog)
        if not parts:
            self._finish([], read.rejects, None, parse_ms, 0.0, None, table, True)
        times = table.column("t").to_numpy()
        i, n_done, seconds = 0, 0, 0.0
        while i < len(parts):
            part = parts[i]
            t1 = time.perf_counter()
            objects = table.take(pa.array(part))
            token = BATCH.set(self.counters["batches"] + 1)  # (log records name it)
            try:
                report = rt.process(objects, admitted=True)  # (read_objects admitted them)
            finally:
                BATCH.reset(token)
            update_ms = (time.perf_counter() - t1) * 1e3
            self._finish([read.entry_ids[j] for j in part.tolist()], read.rejects if i == 0 else [], report,
                         parse_ms if i == 0 else 0.0, update_ms, int(times[part].max()), objects, i + 1 == len(parts))
            took = time.perf_counter() - t1
            batching.observe(len(part), took)
            i, n_done, seconds = i + 1, n_done + len(part), seconds + took
            parts = batching.regroup(parts, i, n_done, seconds)  # too slow for the stream: the rest at once

    def _finish(self, ids: list[str], rejects: list, report, parse_ms: float, update_ms: float,
                top_t: int | None, objects: pa.Table, read_done: bool) -> None:
        """Acknowledge and log one minibatch of ``objects`` (:meth:`Ledger.finish`; ``read_done``:
        the read's last)."""
        rt = self.runtime
        self.life.ledger.finish(ids, rejects, report, parse_ms, update_ms, top_t, rt.refill_parts_ms, rt.window,
                                objects, read_done)
