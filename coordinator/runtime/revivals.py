"""Reviving a lost worker in place, as the runtime does it: when (a batch collected, a call
between batches) and whether (:meth:`Revivals._can_revive`); the work is
:func:`~knnmon.coordinator.runtime.revival.revive`'s."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from knnmon.coordinator.runtime.dispatch import DispatchedBatch
from knnmon.coordinator.runtime.metrics import BatchReport
from knnmon.coordinator.runtime.revival import Revival, revive
from knnmon.errors import WorkerLostError
from knnmon.logs import WORKER

__all__ = ["MAX_REVIVALS", "Revivals"]

log = logging.getLogger("knnmon.runtime")

#: Lost workers a run revives before it gives up (a worker that dies again and again is a bug).
MAX_REVIVALS = 8


class Revivals:
    """The :class:`~knnmon.coordinator.runtime.runtime.Runtime`'s revival methods (its
    ``pool``, ``config``, ``registrar``, ``dispatcher``, ``store``, ``objects``,
    ``workers_revived`` and ``revivals``)."""

    def _reviving(self, call: Callable[[], Any]) -> Any:
        """``call()``, between batches; a worker it finds lost is revived in place and the call
        made again (:meth:`revive_idle`), or the loss raised if it cannot be.

        Raises
        ------
        WorkerLostError
            The lost worker cannot be revived in place (:meth:`_can_revive`).
        """
        while True:
            try:
                return call()
            except WorkerLostError as ex:
                if self.revive_idle(ex.worker) is None:
                    raise

    def _collect(self, d: DispatchedBatch, later: deque[DispatchedBatch]) -> BatchReport:
        """:meth:`Dispatcher.collect` of ``d``; a Ray worker lost meanwhile is revived
        (:func:`~knnmon.coordinator.runtime.revival.revive`), with ``d`` and the batches
        dispatched after it (``later``, updated in place) sent to it again, at most
        :data:`MAX_REVIVALS` times a run.

        With a window ``d`` is replayed on the worker loaded from Redis, or the worker rebuilt
        over the live objects (:mod:`~knnmon.coordinator.runtime.revival`); not while later
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
                return self.dispatcher.collect(d)
            except WorkerLostError as ex:
                if not self._can_revive(between_batches=not later):
                    raise
                revived = self._revive(ex.worker, [d, *later]).batches
                d = revived[0]
                later.clear()
                later.extend(revived[1:])

    def _can_revive(self, *, between_batches: bool = False) -> bool:
        """Whether a lost worker is revived in place: a revivable pool's, fewer than
        :data:`MAX_REVIVALS` revivals so far, and no window unless at most one batch is in
        flight (``between_batches``; see :meth:`_collect`)."""
        return (self.pool.revivable and self.workers_revived < MAX_REVIVALS
                and (self.config.window is None or between_batches))

    def revive_idle(self, worker: int, also: Sequence[str] = ()) -> Revival | None:
        """Revive worker ``worker``, lost with no batch in flight (found by a registration, an
        unregister, the next batch's expiry, ...): from Redis (:func:`revive`, which says what
        a window changes). ``None`` if it cannot be (:meth:`_can_revive`)."""
        return self._revive(worker, also=also) if self._can_revive(between_batches=True) else None

    def _revive(self, worker: int, batches: Sequence[DispatchedBatch] = (), also: Sequence[str] = ()) -> Revival:
        """:func:`revive` (a window: the live objects, the feed version, the replay's refills);
        counted, its steps' times kept in :attr:`revivals`. If the new actor is lost during the
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
        self.revivals.append(revived.seconds)
        return revived

    def _revive_once(self, worker: int, batches: Sequence[DispatchedBatch], also: Sequence[str]) -> Revival:
        """:meth:`_revive`'s attempts, until one's actor lives through it."""
        d = self.dispatcher
        while True:
            try:
                return revive(self.pool, self.registrar, self.store.url, self.config.store.namespace, worker,
                              batches, also=also, live=self.objects if self.config.window is not None else None,
                              version=d.next_batch if d else 0, refill=d.refill_one if d else None)
            except WorkerLostError as ex:
                self.workers_revived += 1
                if ex.worker != worker or self.workers_revived >= MAX_REVIVALS:
                    raise
                log.warning("worker %d's new actor was lost during its revival (%s); reviving it again", worker, ex)
