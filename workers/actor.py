"""The worker as a Ray actor: :class:`~knnmon.workers.worker.KnnWorker` wrapped at the edge.

A service's workers (``knnmon serve`` on a Ray cluster) are **detached** named actors, so that a
restarted service takes the processes of the one before instead of starting new ones: a new
actor process costs ~2.5 s of CPU (Ray's worker start, the imports, the compiled kernels), four
of them ~10 s on the cores a restart needs. A taken actor keeps its state when that equals what
Redis holds (:mod:`~knnmon.workers.kept_state`, :meth:`WorkerHost.kept_for`); else it starts
empty (:meth:`WorkerHost.reset`) and only its process is kept. An actor whose service is gone for
good (its heartbeat ``knn:serve:alive`` older than :data:`ORPHAN_S` at two reads in a row) exits on its own
(:func:`_watch`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace

from knnmon.reports import KeptReport
from knnmon.workers.settings import ORPHAN_S, WorkerSettings
from knnmon.workers.worker import KnnWorker

__all__ = ["ORPHAN_S", "RAY_NAMESPACE", "WorkerActor", "WorkerHost"]

log = logging.getLogger("knnmon.worker")

#: The Ray namespace of the detached worker actors.
RAY_NAMESPACE = "knnmon"


def WorkerActor(num_cpus: float = 0.5, **options):  # noqa: N802 - reads as a class at call sites
    """``ray.remote(WorkerHost)`` with actor options (``num_cpus`` defaults to 0.5, so that more
    workers than cores can be placed, as on the 2-core reference machine).

    Its calls record no Ray task events (``enable_task_events=False`` unless ``options`` say
    otherwise): a service makes several calls per batch, thousands a minute, and Ray's GCS keeps
    the events of up to 100,000 tasks (``RAY_task_events_max_num_task_in_gcs``), so the head
    node's GCS would grow for hours (measured: docs/window.md, the chaos soak's memory). The Ray
    dashboard's task list then shows the actors but not their calls."""
    import ray

    return ray.remote(WorkerHost).options(num_cpus=num_cpus, **{"enable_task_events": False, **options})


class WorkerHost(KnnWorker):
    """A :class:`KnnWorker` whose process a restarted service may take (module docstring).

    ``orphan_s``: with a number, watch the service's heartbeat (at ``watch_url``, else the
    settings' ``redis_url``) and exit once it is older than that many seconds (detached actors);
    ``None``: no watch."""

    def __init__(self, worker_id: int, settings: WorkerSettings, *, orphan_s: float | None = None,
                 watch_url: str | None = None) -> None:
        super().__init__(worker_id, settings)
        if orphan_s is not None and (watch_url or settings.redis_url):
            _start_watch(watch_url or settings.redis_url, settings.namespace, orphan_s)

    def alive(self) -> int:
        """This process's id: the service's liveness check (:mod:`knnmon.coordinator.recovery.liveness`)."""
        return os.getpid()

    def reset(self, worker_id: int, settings: WorkerSettings, *, orphan_s: float | None = None,
              watch_url: str | None = None) -> int:
        """Become a new, empty worker ``worker_id`` (the arguments as :class:`WorkerHost`
        takes them), after the queued writes of the one before; returns this process's id."""
        if getattr(self, "state", None) is not None and self.state.queue is not None:
            self.state.queue.close()
        self.__dict__.clear()
        WorkerHost.__init__(self, worker_id, settings, orphan_s=orphan_s, watch_url=watch_url)
        return os.getpid()

    def kept_for(self, worker_id: int | None, settings: WorkerSettings) -> KeptReport:
        """Whether this worker, as it is, may be worker ``worker_id`` of a service that would
        start it with ``settings`` (``worker_id`` ``None``: any worker): its
        :meth:`~knnmon.workers.kept_state.KeptState.kept_state`, whose ``why`` also says if it
        was another worker or made with other settings. Waits for its queued writes."""
        state = self.kept_state()
        if state.why is None and worker_id is not None and self.state.worker_id != worker_id:
            return replace(state, why=f"it was worker {self.state.worker_id}")
        if state.why is None and self.state.settings != settings:
            return replace(state, why="it was made with other settings")
        return state


@dataclass
class _Watch:
    """What this process's orphan watch reads (one watcher per process; a reset re-aims it)."""

    url: str
    namespace: str
    orphan_s: float
    thread: threading.Thread | None = None


_watched: _Watch | None = None


def _start_watch(redis_url: str | None, namespace: str, orphan_s: float) -> None:
    """Watch ``namespace``'s service heartbeat (one watcher per process; a reset re-aims it)."""
    global _watched
    if not redis_url:
        return
    thread = _watched.thread if _watched is not None else None
    _watched = _Watch(redis_url, namespace, float(orphan_s), thread)
    if thread is None:
        _watched.thread = threading.Thread(target=_watch, name="knnmon-orphan-watch", daemon=True)
        _watched.thread.start()


def _watch() -> None:
    """Exit this process once the service is gone for good: its heartbeat
    (``knn:serve:alive``, refreshed every few seconds while it runs) missing or older than
    ``orphan_s`` at two reads in a row, a tenth of that apart. A Redis that does not answer
    decides nothing."""
    from knnmon.connection import connect
    from knnmon.keys import Keys

    strikes = 0
    while True:
        watch = _watched
        time.sleep(max(watch.orphan_s / 10, 0.05))
        try:
            client = connect(watch.url, socket_timeout_s=5.0)
            try:
                raw = client.get(Keys(watch.namespace).serve_alive)
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - Redis away or unreachable: no decision
            continue
        try:
            age_s = time.time() - float(raw) / 1000
        except (TypeError, ValueError):
            age_s = float("inf")
        strikes = strikes + 1 if age_s > watch.orphan_s else 0
        if strikes >= 2:
            log.warning("the service of namespace %r is gone (heartbeat %.0f s old); this worker exits",
                        watch.namespace, age_s)
            os._exit(0)
