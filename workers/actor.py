"""The worker as a Ray actor: :class:`~knnmon.workers.worker.KnnWorker` wrapped at the edge."""

from __future__ import annotations

__all__ = ["WorkerActor"]


def WorkerActor(num_cpus: float = 0.5, **options):  # noqa: N802 - reads as a class at call sites
    """``ray.remote(KnnWorker)`` with actor options (``num_cpus`` defaults to 0.5, so that more
    workers than cores can be placed, as on the 2-core reference machine).

    Its calls record no Ray task events (``enable_task_events=False`` unless ``options`` say
    otherwise): a service makes several calls per batch, thousands a minute, and Ray's GCS keeps
    the events of up to 100,000 tasks (``RAY_task_events_max_num_task_in_gcs``), so the head
    node's GCS would grow for hours (measured: docs/window.md, the chaos soak's memory). The Ray
    dashboard's task list then shows the actors but not their calls."""
    import ray

    from knnmon.workers.worker import KnnWorker

    return ray.remote(KnnWorker).options(num_cpus=num_cpus, **{"enable_task_events": False, **options})
