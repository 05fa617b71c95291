"""Whether each worker is alive, asked from another thread than the one that dispatches
(``knnmon serve``'s ``/readyz``, :mod:`~knnmon.coordinator.service.probes`).

A Ray actor runs one call at a time, so a check queues behind the batch the worker is on. The
check therefore keeps at most one call outstanding per worker (:meth:`WorkerHost.alive`) and
reads it without waiting for it: a worker is **dead** once that call failed because its actor
died, and alive otherwise (answered, or still busy). A dead actor stays dead for every caller
until the pool replaces it (a revival); the new actor is asked anew. An in-process worker
(``workers.executor inline``) is dead while its pool counts it lost (:class:`InlinePool`).
"""

from __future__ import annotations

import threading
from typing import Any

from knnmon.coordinator.runtime.ray_pool import RayPool
from knnmon.coordinator.runtime.worker_pool import InlinePool, WorkerPool

__all__ = ["WorkerLiveness"]


class WorkerLiveness:
    """Liveness checks of the workers of ``pool`` (module docstring; ``None``: no workers);
    thread-safe."""

    def __init__(self, pool: WorkerPool | None = None) -> None:
        self.pool = pool
        self._asked: dict[int, tuple[Any, Any]] = {}  # worker -> (its actor, the outstanding call)
        self._dead: dict[int, Any] = {}  # worker -> its actor, known dead
        self._lock = threading.Lock()

    def dead(self, wait_s: float = 0.5) -> list[int]:
        """The workers whose actor has died (by number; ``[]`` with no pool). Waits at most
        ``wait_s`` seconds for the answers of calls sent now.

        Raises
        ------
        ray.exceptions.RaySystemError
            Ray itself is gone (the service's Ray instance stopped).
        """
        pool = self.pool
        if isinstance(pool, InlinePool):
            return sorted(pool.lost)
        if not isinstance(pool, RayPool):
            return []
        import ray

        with self._lock:
            actors = list(pool.actors)
            self._dead = {w: a for w, a in self._dead.items() if w < len(actors) and actors[w] is a}
            for w, actor in enumerate(actors):
                if w not in self._dead and (w not in self._asked or self._asked[w][0] is not actor):
                    self._asked[w] = (actor, actor.alive.remote())
            for w in [w for w in self._asked if w >= len(actors) or w in self._dead]:
                del self._asked[w]
            refs = [ref for _, ref in self._asked.values()]
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]) if refs else set()
            for w, (actor, ref) in list(self._asked.items()):
                if ref not in ready:
                    continue  # busy on a batch, or still starting: alive as far as is known
                del self._asked[w]  # answered: asked again next time
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._dead[w] = actor
            return sorted(self._dead)
