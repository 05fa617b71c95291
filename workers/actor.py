"""The worker as a Ray actor: :class:`~knnmon.workers.worker.KnnWorker` wrapped at the edge."""

from __future__ import annotations

__all__ = ["WorkerActor"]


def WorkerActor(num_cpus: float = 0.5, **options):  # noqa: N802 - reads as a class at call sites
    """``ray.remote(KnnWorker)`` with actor options (``num_cpus`` defaults to 0.5, so that more
    workers than cores can be placed, as on the 2-core reference machine)."""
    import ray

    from knnmon.workers.worker import KnnWorker

    return ray.remote(KnnWorker).options(num_cpus=num_cpus, **options)
