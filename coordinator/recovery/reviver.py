"""Reviving a lost worker in place, as the runtime does it: when (a batch collected, a call
between batches) and whether (:meth:`Reviver.can_revive`); the work is
:func:`~knnmon.coordinator.recovery.revival.revive`'s."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from knnmon.coordinator.runtime.dispatch import DispatchedBatch
from knnmon.coordinator.runtime.metrics import BatchReport
from knnmon.coordinator.recovery.revival import Revival, revive
from knnmon.errors import WorkerLostError
from knnmon.logs import WORKER

if TYPE_CHECKING:
    from knnmon.coordinator.runtime.runtime import Runtime

__all__ = ["MAX_REVIVALS", "Reviver"]

log = logging.getLogger("knnmon.runtime")

#: Lost workers a run revives before it gives up (a worker that dies again and again is a bug).
MAX_REVIVALS = 8


class Reviver:
    """The :class:`~knnmon.coordinator.runtime.runtime.Runtime`'s revivals of lost workers
    (module docstring), built with the runtime whose parts it uses (its ``pool``, ``config``,
    ``registrar``, ``dispatcher``, ``store`` and ``objects``, once started).

    Attributes
    ----------
    workers_revived : int
        Lost workers brought back so far (each attempt on a new actor counts).
    reviving : int or None
        The worker being revived now (read from another thread: ``/readyz``).
    seconds : list of dict
        Each revival's steps' seconds (:attr:`~knnmon.coordinator.recovery.revival.Revival.seconds`).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.workers_revived = 0
        self.reviving: int | None = None
        self.seconds: list[dict[str, float]] = []

    def call(self, call: Callable[[], Any]) -> Any:
        """``call()``, between batches; a worker it finds lost is revived in place and the call
        made again (:meth:`revive_idle`), or the loss raised if it cannot be.

        Raises
        ------
        WorkerLostError
            The lost worker cannot be revived in place (:meth:`can_revive`).
        """
        while True:
            try:
                return call()
            except WorkerLostError as ex:
                if self.revive_idle(ex.worker) is None:
                    raise

    def collect(self, d: DispatchedBatch, later: deque[DispatchedBatch]) -> BatchReport:
        """:meth:`Dispatcher.collect` of ``d``; a Ray worker lost meanwhile is revived
        (:func:`~knnmon.coordinator.recovery.revival.revive`), with ``d`` and the batches
        dispatched after it (``later``, updated in place) sent to it again, at most
        :data:`MAX_REVIVALS` times a run.

        With a window ``d`` is replayed on the worker loaded from Redis, or the worker rebuilt
        over the live objects (:mod:`~knnmon.coordinator.recovery.revival`); not while later
        batches are in flight too (the live objects have moved past ``d``): then ``knnmon run``
        stops with the error (``knnmon serve`` has one batch in flight).

        Raises
        ------
        WorkerLostError
            A pool that cannot revive, with a window and later batches in flight, or after
            :data:`MAX_REVIVALS` revivals.
        """
        while True:
            try:
                return self.runtime.dispatcher.collect(d)
            except WorkerLostError as ex:
                if not self.can_revive(between_batches=not later):
                    raise
                revived = self._revive(ex.worker, [d, *later]).batches
                d = revived[0]
                later.clear()
                later.extend(revived[1:])

    def can_revive(self, *, between_batches: bool = False) -> bool:
        """Whether a lost worker is revived in place: a revivable pool's, fewer than
        :data:`MAX_REVIVALS` revivals so far, and no window unless at most one batch is in
        flight (``between_batches``; see :meth:`collect`)."""
        return (self.runtime.pool.revivable and self.workers_revived < MAX_REVIVALS
                and (self.runtime.config.window is None or between_batches))

    def revive_idle(self, worker: int, also: Sequence[str] = ()) -> Revival | None:
        """Revive worker ``worker``, lost with no batch in flight (found by a registration, an
        unregister, the next batch's expiry, ...): from Redis (:func:`revive`, which says what
        a window changes). ``None`` if it cannot be (:meth:`can_revive`)."""
        return self._revive(worker, also=also) if self.can_revive(between_batches=True) else None

    def _revive(self, worker: int, batches: Sequence[DispatchedBatch] = (), also: Sequence[str] = ()) -> Revival:
        """:func:`revive` (a window: the live objects, the feed version, the replay's refills);
        counted, its steps' times kept in :attr:`seconds`. If the new actor is lost during the
        revival (the pool's spare died with the node that took the worker), the revival starts
        over on another actor, counted as another revival.

        Raises
        ------
        WorkerLostError
            Another worker lost meanwhile, or :data:`MAX_REVIVALS` reached.
        """
        token = WORKER.set(worker)  # (its log records name it)
        self.reviving = worker
        try:
            revived = self._revive_once(worker, batches, also)
        finally:
            WORKER.reset(token)
            self.reviving = None
        self.workers_revived += 1
        self.seconds.append(revived.seconds)
        return revived

    def _revive_once(self, worker: int, batches: Sequence[DispatchedBatch], also: Sequence[str]) -> Revival:
        """:meth:`_revive`'s attempts, until one's actor lives through it."""
        rt = self.runtime
        d, c = rt.dispatcher, rt.config
        while True:
            try:
                return revive(rt.pool, rt.registrar, rt.store.url, c.store.namespace, worker,
                              batches, also=also, live=rt.objects if c.window is not None else None,
                              version=d.next_batch if d else 0, refill=d.refill_one if d else None)
            except WorkerLostError as ex:
                self.workers_revived += 1
                if ex.worker != worker or self.workers_revived >= MAX_REVIVALS:
                    raise
                log.warning("worker %d's new actor was lost during its revival (%s); reviving it again", worker, ex)
