"""The service loop's side of Redis and worker faults: an outage ridden out (a step failed
because Redis went away), a Redis that restarted while the retries hid it (no step failed), and
a worker whose actor died while the service idles.

:class:`Watch` is built with the service's :class:`~knnmon.coordinator.service.lifecycle.Lifecycle`
and the loop's ways to rebuild from Redis and to catch up on what was delivered; the loop calls
:meth:`Watch.ride_out` when a step fails with Redis away, :meth:`Watch.server` after each step
and :meth:`Watch.workers` when a step found nothing to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from knnmon.coordinator.recovery.outage import (caused_by, connect_when_up, is_infrastructure, kept_every_write,
                                                server_ids)
from knnmon.errors import WorkerLostError

if TYPE_CHECKING:
    from knnmon.coordinator.service.lifecycle import Lifecycle

__all__ = ["Watch"]

log = logging.getLogger("knnmon.serve")


class Watch:
    """Redis's server and the workers' actors, checked between the loop's steps (module
    docstring).

    Parameters
    ----------
    life
        The service's state: its Redis client, reader, runtime, counters and
        :attr:`~knnmon.coordinator.service.lifecycle.Lifecycle.recovered_from`.
    rebuild
        Rebuilds the state from Redis (the loop's, which re-applies pending query operations).
    catch_up
        Applies the entries delivered and never acknowledged (the loop's).
    applying
        Whether the loop is in the middle of applying entries (its state ahead of what is
        acknowledged: then an outage is not ridden out but rebuilt from).
    """

    def __init__(self, life: Lifecycle, *, rebuild: Callable[[], None], catch_up: Callable[[], None],
                 applying: Callable[[], bool]) -> None:
        self.life = life
        self.rebuild, self.catch_up, self.applying = rebuild, catch_up, applying
        self.server_checked = 0.0  # when the server was last compared (time.monotonic)
        self.workers_checked = 0.0  # when the idle loop last looked for dead workers (time.monotonic)
        self.dead_seen: set[int] = set()  # the workers found dead then

    def kept_every_write(self) -> bool:
        """Whether Redis, back after an outage or a restart, kept every write
        (:func:`~knnmon.coordinator.recovery.outage.kept_every_write`); if it did, its server is
        the one watched from now on."""
        life = self.life
        why = kept_every_write(life.client, life.keys, life.recovered_from, life.reader.last_ids,
                               life.runtime.last_writes)
        if why is not None:
            log.warning("Redis is back without some writes (%s): rebuilding from it", why)
            return False
        life.recovered_from = server_ids(life.client)
        return True

    def server(self, every_s: float = 1.0) -> None:
        """Once every ``every_s``: a Redis that restarted while the retries hid it (no read
        failed) is checked as after an outage (:meth:`kept_every_write`); one that came back
        without some writes is rebuilt from."""
        now = time.monotonic()
        if now - self.server_checked < every_s:
            return
        self.server_checked = now
        ids = server_ids(self.life.client)
        if ids is None or ids == self.life.recovered_from:
            return
        if self.kept_every_write():
            self.life.counters["redis_outages"] += 1
            log.warning("Redis restarted meanwhile (the retries waited for it) and kept every write: nothing rebuilt")
        else:
            self.rebuild()

    def workers(self, every_s: float = 5.0) -> None:
        """Once every ``every_s``, while idle: a worker whose actor died
        (:class:`~knnmon.coordinator.recovery.liveness.WorkerLiveness`), found dead at two checks
        in a row, is revived in place now (:meth:`Runtime.revive_idle`), not when the next batch
        or query operation needs it, so that an idle service heals and ``/readyz`` turns ready
        again (after reporting the loss for at least ``every_s``). A worker that cannot be
        revived in place is left to the next batch, which rebuilds from Redis."""
        now = time.monotonic()
        if now - self.workers_checked < every_s:
            return
        self.workers_checked = now
        try:
            dead = self.life.telemetry.liveness.dead(wait_s=0.0)
        except Exception as ex:  # noqa: BLE001 - Ray unreachable: the next batch finds out
            log.debug("the workers' liveness could not be checked (%s: %s)", type(ex).__name__, ex)
            return
        confirmed, self.dead_seen = [w for w in dead if w in self.dead_seen], set(dead)
        for w in confirmed:
            log.warning("worker %d's actor died while the service was idle: reviving it", w)
            self.dead_seen.discard(w)
            if self.life.runtime.revive_idle(w) is None:
                return

    def ride_out(self, ex: Exception) -> bool:
        """Redis stopped answering between two applications: wait for it; ``True`` if it kept
        every write (:meth:`kept_every_write`) and the entries delivered meanwhile are applied
        (:attr:`catch_up`; then counted in ``redis_outages``), ``False`` if the state must be
        rebuilt from it (by the caller). Redis going away again meanwhile, nothing half applied,
        is waited for again (10 times at most).

        Raises
        ------
        Exception
            What the catch-up raised that is not Redis or a worker going away.
        """
        t0 = time.perf_counter()
        life = self.life
        for _ in range(10):
            log.warning("Redis unreachable (%s: %s); waiting for it", type(ex).__name__, ex)
            try:
                connect_when_up(life.redis_url, lambda: life.stopping).close()
                if not self.kept_every_write():
                    return False
                self.catch_up()  # delivered, the replies lost: applied now
            except Exception as again:  # noqa: BLE001 - Redis or a worker gone again
                if not is_infrastructure(again):
                    raise
                log.warning("riding out the Redis outage failed (%s: %s)", type(again).__name__, again)
                if caused_by(again, WorkerLostError) or self.applying() or life.stopping:
                    return False  # (a worker lost, or a batch half applied: rebuilt)
                ex = again
                continue
            life.counters["redis_outages"] += 1
            log.warning("Redis is back with every write: serving again after %.1f s, nothing rebuilt",
                        time.perf_counter() - t0)
            return True
        return False
