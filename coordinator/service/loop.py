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

At start the state is rebuilt from Redis (:mod:`~knnmon.coordinator.service.recovery`):
nothing acknowledged is lost or duplicated, even after SIGKILL. A worker lost on the way is
revived in place by the runtime (:mod:`~knnmon.coordinator.runtime.revival`). When Redis stops
answering, the service waits for it and goes on without a rebuild if it kept every write
(:mod:`~knnmon.coordinator.service.outage`); otherwise, as when a worker cannot be revived, the
state is rebuilt from Redis. An entry whose processing fails
for any other reason is isolated (:meth:`Service._guarded`). SIGTERM (or Ctrl-C) lets the batch
in flight finish and be acknowledged, then stops cleanly.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from knnmon.coordinator.service.intake import Entry, read_objects
from knnmon.coordinator.service.lifecycle import COUNTERS, Lifecycle
from knnmon.coordinator.service.outage import kept_every_write, server_ids
from knnmon.coordinator.service.startup import caused_by, connect_when_up, is_infrastructure
from knnmon.errors import Rejected, WorkerLostError
from knnmon.logs import BATCH

__all__ = ["COUNTERS", "Service"]

log = logging.getLogger("knnmon.serve")


class Service(Lifecycle):
    """The service (module docstring): :meth:`start`, then :meth:`run`; :meth:`close` at the end.
    Its state and lifecycle: :class:`~knnmon.coordinator.service.lifecycle.Lifecycle`."""

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
        if handle_signals:
            self._install_signals()
        self.stopping = self._stop_asked  # (a run that ended idle may be followed by another)
        self._apply_pending_query_ops()
        idle_since = time.monotonic()
        failures = 0
        stale = False  # work done since the status was last published
        rebuild = False  # a failure asked for a rebuild from Redis, not yet done
        while not self.stopping:
            try:
                if rebuild:
                    self._restart()  # (it may fail too, Redis going away again: retried as any step)
                    rebuild = False
                did = self._step(wait=not stale)  # (work done: is there more, without waiting?)
                self._watch_server()
                if not did:
                    self._revive_lost()
                self._follow_revivals()
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
                elif not rebuild and not self._applying and self._ride_out(ex):
                    failures = 0  # (Redis came back with every write: progress, however often it restarts)
                    continue
                if self.stopping:  # nothing rebuilt for a service that stops: what is pending stays so
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
            self._publish_status(force=stale and not did)  # at once when the work runs out
            stale = stale and did
        self.stopping = True  # the loop is over: the last status says so
        self._publish_status(force=True)
        return dict(self.counters)

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish the batch in flight and return."""
        if not self.stopping:
            log.info("stopping: finishing the batch in flight")
        self.stopping = self._stop_asked = True

    def _install_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)

    def _watch_server(self, every_s: float = 1.0) -> None:
        """Between steps, once every ``every_s``: a Redis that restarted while the retries hid
        it (no read failed) is checked as after an outage
        (:func:`~knnmon.coordinator.service.outage.kept_every_write`); one that came back without
        some writes is rebuilt from."""
        now = time.monotonic()
        if now - self._server_checked < every_s:
            return
        self._server_checked = now
        ids = server_ids(self.client)
        if ids is None or ids == self._server_ids:
            return
        if self._kept_every_write():
            self.counters["redis_outages"] += 1
            log.warning("Redis restarted meanwhile (the retries waited for it) and kept every write: nothing rebuilt")
        else:
            self._restart()

    def _revive_lost(self, every_s: float = 5.0) -> None:
        """While idle, once every ``every_s``: a worker whose actor died
        (:class:`~knnmon.coordinator.runtime.liveness.WorkerLiveness`), found dead at two checks
        in a row, is revived in place now (:meth:`Runtime.revive_idle`), not when the next batch
        or query operation needs it, so that an idle service heals and ``/readyz`` turns ready
        again (after reporting the loss for at least ``every_s``). A worker that cannot be
        revived in place is left to the next batch, which rebuilds from Redis."""
        now = time.monotonic()
        if now - self._lost_checked < every_s:
            return
        self._lost_checked = now
        try:
            dead = self.telemetry.liveness.dead(wait_s=0.0)
        except Exception as ex:  # noqa: BLE001 - Ray unreachable: the next batch finds out
            log.debug("the workers' liveness could not be checked (%s: %s)", type(ex).__name__, ex)
            return
        confirmed, self._dead_seen = [w for w in dead if w in self._dead_seen], set(dead)
        for w in confirmed:
            log.warning("worker %d's actor died while the service was idle: reviving it", w)
            self._dead_seen.discard(w)
            if self.runtime.revive_idle(w) is None:
                return

    def _kept_every_write(self) -> bool:
        """Whether Redis, back after an outage or a restart, kept every write
        (:func:`~knnmon.coordinator.service.outage.kept_every_write`); if it did, its server is
        the one watched from now on."""
        why = kept_every_write(self.client, self.keys, self._server_ids, self.reader.last_ids,
                               self.runtime.last_writes)
        if why is not None:
            log.warning("Redis is back without some writes (%s): rebuilding from it", why)
            return False
        self._server_ids = server_ids(self.client)
        return True

    def _ride_out(self, ex: Exception) -> bool:
        """Redis stopped answering between two applications: wait for it; ``True`` if it kept
        every write (:func:`~knnmon.coordinator.service.outage.kept_every_write`) and the entries
        delivered meanwhile are applied (then counted in ``redis_outages``), ``False`` if the
        state must be rebuilt from it (by the caller). Redis going away again meanwhile, nothing
        half applied, is waited for again (10 times at most)."""
        t0 = time.perf_counter()
        for _ in range(10):
            log.warning("Redis unreachable (%s: %s); waiting for it", type(ex).__name__, ex)
            try:
                connect_when_up(self.redis_url, lambda: self.stopping).close()
                if not self._kept_every_write():
                    return False
                self._apply_pending_query_ops()
                ko = self.keys.ingest_objects
                while entries := (self.reader.read({ko: "0"}, self.config.run.batch, None) or [(ko, [])])[0][1]:
                    self._guarded(ko, entries, self._process_objects)  # delivered, the reply lost: applied now
            except Exception as again:  # noqa: BLE001 - Redis or a worker gone again
                if not is_infrastructure(again):
                    raise
                log.warning("riding out the Redis outage failed (%s: %s)", type(again).__name__, again)
                if caused_by(again, WorkerLostError) or self._applying or self.stopping:
                    return False  # (a worker lost, or a batch half applied: rebuilt)
                ex = again
                continue
            self.counters["redis_outages"] += 1
            log.warning("Redis is back with every write: serving again after %.1f s, nothing rebuilt",
                        time.perf_counter() - t0)
            return True
        return False

    def _restart(self, skip: frozenset[str] = frozenset()) -> None:
        """Drop the workers and rebuild everything from Redis, leaving the entries ``skip`` (of
        either stream) pending for the caller."""
        self.counters["recoveries"] += 1
        self._drop_workers()
        time.sleep(0.5)
        self._recover(skip)
        self._apply_pending_query_ops(skip)

    def _apply_pending_query_ops(self, skip: frozenset[str] = frozenset()) -> None:
        """Re-apply query operations delivered before a restart but never acknowledged (but
        those in ``skip``)."""
        kq, start = self.keys.ingest_queries, "0"
        while True:
            got = self.reader.read({kq: start}, 1000, None)
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
                self.ledger.ack(stream, [eid], [(eid, fields, Rejected("internal_error", detail))])
        self._applying = False

    def _step(self, wait: bool = True) -> bool:
        """One read of both streams (``wait``: blocking up to ``block_ms`` for entries);
        query operations applied, objects batched. ``True`` if anything was done."""
        ko, kq = self.keys.ingest_objects, self.keys.ingest_queries
        got = self.reader.read({kq: ">", ko: ">"}, self.batching.batch, self.config.block_ms if wait else None)
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
            while len(objects) < self.config.run.batch and self.batching.wait_ms > 0:
                wait = int((deadline - time.monotonic()) * 1000)
                more = self.reader.read({ko: ">"}, self.config.run.batch - len(objects), wait if wait >= 1 else None)
                if not more or not more[0][1]:
                    if wait < 1:
                        break
                    continue
                objects += more[0][1]
            self.counters["objects_entries_read"] += len(objects)
            self.batching.read(len(objects))
            self._backlog = len(objects) >= self.batching.batch
            self._guarded(ko, objects, self._process_objects)
        return bool(got)

    def _apply_query_ops(self, entries: list[Entry]) -> None:
        """Apply query operations in order, then acknowledge them with their rejects."""
        rejects = self.query_ops.apply(entries, self.runtime)
        self.ledger.ack(self.keys.ingest_queries, [e for e, _ in entries], rejects)
        self.runtime.upkeep_routing()  # unregistered queries' routing entries go in time

    def _process_objects(self, entries: list[Entry]) -> None:
        """Parse and reject a read's entries, then process its objects in the minibatches the
        batching policy cuts (:mod:`~knnmon.coordinator.service.batching`), each acknowledged
        (its results released) before the next runs; rejects go with the first."""
        rt = self.runtime
        t0 = time.perf_counter()
        read = read_objects(entries, rt, self.config.run.limits, self.client)
        self.counters["late"] += read.late
        table = read.objects
        parse_ms = (time.perf_counter() - t0) * 1e3
        parts = self.batching.cut(table.num_rows, backlog=self._backlog)
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
            self.batching.observe(len(part), took)
            i, n_done, seconds = i + 1, n_done + len(part), seconds + took
            parts = self.batching.regroup(parts, i, n_done, seconds)  # too slow for the stream: the rest at once

    def _finish(self, ids: list[str], rejects: list, report, parse_ms: float, update_ms: float,
                top_t: int | None, objects: pa.Table, read_done: bool) -> None:
        """Acknowledge and log one minibatch of ``objects`` (:meth:`Ledger.finish`; ``read_done``:
        the read's last)."""
        rt = self.runtime
        self.ledger.finish(ids, rejects, report, parse_ms, update_ms, top_t, rt.refill_parts_ms, rt.window, objects,
                           read_done)
