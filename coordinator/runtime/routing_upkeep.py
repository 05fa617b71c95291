"""Routing upkeep: rebuild the routing table from the queries' current regions now and then.

At run time the routing table only grows: a registration adds its query's region, and with a
window every refill adds the refilled query's larger one (to a small delta,
:class:`~knnmon.assignment.routing.RoutingTable`). Nothing shrinks it when radii shrink, and an
unregistered query's entries stay. So once the table holds 1.5 times the entries of its last
build (plus :data:`SLACK`), or :data:`UNREGISTERED_SHARE` of the queries were unregistered since,
or it had additions and :data:`REBUILD_S` passed since its last build (radii shrink: a table built
while results were short routes too widely), it is built again from every worker's queries and radii as they are now (the plan's
:meth:`RoutingTable.build` over a :class:`~knnmon.assignment.workload.Workload` of them), in
place, keeping its keyword codes (the workers' batches are encoded with them). Its size then
follows the registered queries' regions, not history.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from knnmon.assignment.base import Plan
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.routing import RoutingTable
from knnmon.assignment.workload import Workload
from knnmon.coordinator.runtime.worker_pool import WorkerPool

__all__ = ["REBUILD_S", "RoutingUpkeep", "SLACK", "UNREGISTERED_SHARE"]

log = logging.getLogger("knnmon.runtime")

#: Entries the table may grow by beyond 1.5x its last build before it is rebuilt.
SLACK = 1 << 16
#: Share of the queries unregistered since the last build that makes a rebuild due.
UNREGISTERED_SHARE = 0.1
#: Seconds after which a table that had additions since its last build is rebuilt.
REBUILD_S = 120.0


class RoutingUpkeep:
    """When and how the routing table is rebuilt (module docstring).

    Parameters
    ----------
    routing
        The run's table (rebuilt in place).
    model
        The plan's load model (grid and keyword statistics).
    pool
        The workers (asked for their queries' regions).
    max_entries
        The table's bound (``--routing-entries``).
    """

    def __init__(self, routing: RoutingTable, model: LoadModel, pool: WorkerPool, max_entries: int) -> None:
        self.routing, self.model, self.pool, self.max_entries = routing, model, pool, max_entries
        self.baseline = routing.entries
        self._unregistered_at = 0
        self.rebuilds = 0
        self._built_at = time.monotonic()
        self._additions_at = routing.additions

    def due(self, queries: int, unregistered: int) -> bool:
        """Whether the table grew or went stale enough to rebuild (``queries``: registered now;
        ``unregistered``: unregistered in all so far)."""
        return (self.routing.entries > 1.5 * self.baseline + SLACK
                or unregistered - self._unregistered_at >= max(1.0, UNREGISTERED_SHARE * queries)
                or (self.routing.additions > self._additions_at and time.monotonic() - self._built_at >= REBUILD_S))

    def rebuild(self, unregistered: int = 0) -> float:
        """Rebuild the table from the workers' queries as they are now (``unregistered`` as in
        :meth:`due`); returns seconds spent."""
        t0 = time.perf_counter()
        parts = self.pool.call_all("regions")
        workers = np.concatenate([np.full(len(c.ids), w, dtype=np.int32) for w, (c, _) in enumerate(parts)])
        r = self.routing
        if not len(workers):
            r.replace_entries(np.zeros(len(r.vocabulary), dtype=np.uint64), np.empty(0, np.int64),
                              np.empty(0, np.uint64))
        else:
            queries = pa.concat_tables([c.to_table() for c, _ in parts])
            radius = np.concatenate([rad for _, rad in parts])
            workload = Workload.build(self.model, queries, radius)
            plan = Plan("upkeep", self.pool.size, workers, np.zeros(len(workers), dtype=np.int32), [],
                        np.empty(0, dtype=np.int32))
            fresh = RoutingTable.build(workload, self.model, plan, self.max_entries)
            code = np.array([r.code(w) for w in fresh.vocabulary], dtype=np.int64)  # in the run's codes
            always = np.zeros(len(r.vocabulary), dtype=np.uint64)
            always[code] = fresh.always
            n = r.grid.n_cells
            keys = code[fresh.keys // n] * n + fresh.keys % n
            order = np.argsort(keys, kind="stable")
            r.replace_entries(always, keys[order], fresh.masks[order])
        self.baseline, self._unregistered_at = r.entries, unregistered
        self._built_at, self._additions_at = time.monotonic(), r.additions
        self.rebuilds += 1
        seconds = time.perf_counter() - t0
        log.info("routing table rebuilt from %d queries' regions: %d entries, %.2f s", len(workers), r.entries, seconds)
        return seconds
