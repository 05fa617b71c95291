"""Moving queries between live workers at a batch boundary, exactly.

The coordinator calls this between two dispatches, so no batch is routed while it runs. Batches
dispatched before it may still be in flight; that is safe because a Ray actor runs calls in the
order they were sent:

1. every source's ``export_queries`` (:mod:`knnmon.workers.handover`) runs after the batches
   sent to it before: the top-k, radii and generations it hands over include them;
2. every target's ``adopt_queries`` runs after the batches sent to it before, which were routed
   while the queries were still the source's (so the target, not holding them, ignored them for
   these queries), and before any batch sent after: from the next batch on, the target holds them;
3. the routing table learns each moved query's region for its target (the source's entries stay
   until the next rebuild, which is requested: more deliveries meanwhile, never a lost one), and
   the registrar's query -> worker map switches, both before the next dispatch;
4. every source's ``release_handed`` drops details only the moved queries held.

No batch is applied to a moved query twice or missed, and its result in Redis does not change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from knnmon.coordinator.rebalance.planner import Move
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.runtime.worker_pool import WorkerPool

__all__ = ["migrate"]


def migrate(pool: WorkerPool, registrar: Registrar, moves: Sequence[Move], *, reserve: int = 0,
            note: dict[str, str] | None = None) -> dict[str, float]:
    """Carry out ``moves`` (module docstring); returns ``{"queries": moved, "seconds": ...}``.

    ``reserve``: the workers' reserve (the region routed is that of the ``k + reserve``-th
    place, as at registration). ``note``: fields written into each moved query's hash (when and
    why it moved, for ``knnmon explain``), besides ``moved_from`` (its source worker).

    Raises
    ------
    WorkerLostError
        A worker died during the move (``knnmon serve`` recovers from Redis; ``knnmon run`` stops).
    """
    t0 = time.perf_counter()
    by_source: dict[int, list[Move]] = {}
    for m in moves:
        if m.qids:
            by_source.setdefault(m.source, []).append(m)
    sources = sorted(by_source)
    exports = pool.gather([pool.export(s, [q for m in by_source[s] for q in m.qids])
                           for s in sources])
    routing, model = registrar.plan.routing, registrar.plan.model
    adopts, parts = [], []
    for s, h in zip(sources, exports):
        at = {q: i for i, q in enumerate(h.queries.ids)}
        for m in by_source[s]:
            part = h.take([at[q] for q in m.qids if q in at])
            if not len(part):
                continue
            vocabulary = {x: routing.code(x) for kws in part.queries.keywords for x in kws}
            adopts.append(pool.adopt(m.target, part, vocabulary,
                                {**(note or {}), "moved_from": str(m.source)}))
            parts.append((m, part))
    pool.gather(adopts)
    moved = 0
    for m, part in parts:
        q = part.queries
        k = np.asarray(q.k, dtype=np.int64) + reserve
        radius = part.topk.kth(k)  # the last kept place's, once full
        rect = model.rects(np.asarray(q.lon, dtype=np.float64), np.asarray(q.lat, dtype=np.float64), radius)
        routing.add_many([[routing.code(x) for x in kws] for kws in q.keywords], rect.x0, rect.y0, rect.x1, rect.y1,
                         np.full(len(q.ids), m.target))
        for qid in q.ids:
            registrar.query_worker[qid] = m.target
        registrar.worker_queries[m.source] -= len(q.ids)
        registrar.worker_queries[m.target] += len(q.ids)
        moved += len(q.ids)
    pool.gather([pool.release_handed(s) for s in sources])
    return {"queries": moved, "seconds": time.perf_counter() - t0}
