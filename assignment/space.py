"""Baseline 2 of the paper (§5): queries distributed by location only (a uniform grid).

The statistics grid's box is cut into ``rows x cols = W`` equal rectangles (``cols >= rows``,
the factor pair of ``W`` closest to square; a prime ``W`` gives one row of ``W`` columns).
Rectangle ``i`` (row-major from the south-west) is worker ``i``; a query goes to the rectangle
holding its location (clamped to the box). Keywords and loads play no part: this is the
straightforward space partitioning whose imbalance the paper's proposal avoids.
"""

from __future__ import annotations

import math

import numpy as np

from knnmon.assignment.base import Assigner, Plan, QuerySet
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload

__all__ = ["SpaceAssigner", "grid_shape"]


def grid_shape(workers: int) -> tuple[int, int]:
    """``(rows, cols)`` with ``rows * cols == workers``, ``rows <= cols``, as square as possible."""
    rows = max(r for r in range(1, int(math.isqrt(workers)) + 1) if workers % r == 0)
    return rows, workers // rows


class SpaceAssigner(Assigner):
    """Space-only (uniform grid) partitioning."""

    name = "space"

    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        self.check_workers(workers)
        rows, cols = grid_shape(workers)
        x0, y0, x1, y1 = model.grid_region
        cx = np.clip(np.floor((workload.lon - x0) / (x1 - x0) * cols), 0, cols - 1).astype(np.int32)
        cy = np.clip(np.floor((workload.lat - y0) / (y1 - y0) * rows), 0, rows - 1).astype(np.int32)
        worker = cy * cols + cx
        sets = []
        for w in range(workers):
            r, c = divmod(w, cols)
            region = (x0 + (x1 - x0) * c / cols, y0 + (y1 - y0) * r / rows,
                      x0 + (x1 - x0) * (c + 1) / cols, y0 + (y1 - y0) * (r + 1) / rows)
            members = np.flatnonzero(worker == w)
            sets.append(QuerySet(members, float(workload.load[members].sum()),
                                 [f"space: grid rectangle row {r + 1}/{rows}, column {c + 1}/{cols}: lon "
                                  f"[{region[0]:.4f}, {region[2]:.4f}] lat [{region[1]:.4f}, {region[3]:.4f}]"], region))
        return self._plan_from_sets(workload, sets, np.arange(workers), workers, {"rows": rows, "cols": cols})
