"""A worker's settings that the coordinator checks before any worker starts (light: no numpy,
no compiled kernels), so that reading the settings does not load the worker."""

from __future__ import annotations

__all__ = ["INDEX_NAMES", "MAX_RELEASE_GROUPS"]

#: The workers' query indexes (``--index``; the classes: :data:`knnmon.workers.worker.INDEXES`).
INDEX_NAMES = ("grid", "rtree", "keyword-lists")

#: At most this many parts per batch (:class:`~knnmon.workers.worker.KnnWorker`'s
#: ``release_groups``): each costs a script call.
MAX_RELEASE_GROUPS = 64
