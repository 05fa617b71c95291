"""The runtime's part of ``knnmon serve``'s status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knnmon.coordinator.runtime.runtime import Runtime

__all__ = ["RuntimeStatus"]


@dataclass(frozen=True)
class RuntimeStatus:
    """The runtime's part of ``knnmon serve``'s status (:meth:`Runtime.status`): registered
    queries and predicted load per worker, workers revived so far, objects held (with a window:
    live), the routing table's entries, and with a window the watermark and the largest ``t``
    applied (epoch ms)."""

    queries_per_worker: list[int]
    predicted_load_per_worker: list[float]
    workers_revived: int
    objects_held: int | None
    routing_entries: int | None
    watermark_ms: int | None
    top_t_ms: int | None

    @classmethod
    def of(cls, rt: Runtime) -> RuntimeStatus:
        """Of a started runtime ``rt``."""
        r, window = rt.registrar, rt.dispatcher.window if rt.dispatcher is not None else None
        return cls(queries_per_worker=r.worker_queries.tolist(),
                   predicted_load_per_worker=r.worker_loads.round(6).tolist(),
                   workers_revived=rt.workers_revived,
                   objects_held=len(rt.objects) if rt.objects is not None else None,
                   routing_entries=rt.plan.routing.entries if rt.plan is not None else None,
                   watermark_ms=window.watermark if window is not None else None,
                   top_t_ms=window.top if window is not None else None)
