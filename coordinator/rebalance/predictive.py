"""The predictive trigger (``--rebalance-trigger predictive``): CoDD's way of following drift.

CoDD (Anand & Chawathe, ``../shared/papers/codd_anand_chawathe.md``) re-organises dissemination
from statistics of the recent stream rather than from measured work. Here: the grid counts
``cnt[c][key]`` of the objects routed in the last ``window`` batches (:class:`RecentCounts`)
replace the initial objects' in the plan's load model (Tsuruoka et al. 2019, §4.2, formula (7)),
and the model's query load ``L(q) = sum_{key in q} P(R_q, key)`` (formula (8)) of every planned
query, over its region at the plan's radius, is summed per worker as the queries are placed now
(:func:`predicted_loads`). A worker's predicted busy time is the cost model's per-batch term plus
its share of the measured busy time of all workers, in proportion to its predicted load. The
re-balancer re-plans when the predicted slowest / mean exceeds the threshold, with the predicted
per-query loads in place of the workers' measured ones: no worker is asked for anything until
the move.

Queries registered at run time are not in the plan's workload: they are not predicted, and do not
move by this trigger.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload
from knnmon.grid import Grid

__all__ = ["RecentCounts", "predicted_loads"]


class RecentCounts:
    """The ``(keyword, cell)`` counts of the objects routed in the last ``batches`` batches.

    Parameters
    ----------
    grid
        The routing table's grid.
    batches
        How many batches are kept, ``>= 1``.
    """

    def __init__(self, grid: Grid, batches: int) -> None:
        self.grid = grid
        self._keys: deque[np.ndarray] = deque(maxlen=max(int(batches), 1))
        self._objects: deque[int] = deque(maxlen=max(int(batches), 1))

    def observe(self, cells: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray) -> None:
        """Count a routed batch: ``cells`` ``(n,)`` int cell of each object, and its (object,
        keyword code) pairs ``(p,)`` int64 each (the routing table's codes, ``>= 0``)."""
        cells = np.asarray(cells, dtype=np.int64)
        self._keys.append(np.asarray(pair_code, dtype=np.int64) * self.grid.n_cells + cells[pair_obj])
        self._objects.append(len(cells))

    def copy(self) -> RecentCounts:
        """The counts as they are now (the planning thread reads them while batches are counted)."""
        out = RecentCounts(self.grid, self._keys.maxlen or 1)
        out._keys.extend(self._keys)
        out._objects.extend(self._objects)
        return out

    @property
    def objects(self) -> int:
        """Objects counted (the last ``batches`` batches')."""
        return int(sum(self._objects))

    def model(self, n_codes: int) -> LoadModel | None:
        """A load model of these counts over ``n_codes`` keyword codes (the routing table's: the
        plan's model's keywords first, so a workload's codes index it); ``None`` before any
        object was counted."""
        if not self.objects:
            return None
        keys, counts = np.unique(np.concatenate(list(self._keys)), return_counts=True)
        code, cell = np.divmod(keys, self.grid.n_cells)
        ok = code < n_codes
        code, cell, counts = code[ok], cell[ok], counts[ok]
        ptr = np.searchsorted(code, np.arange(n_codes + 1)).astype(np.int64)
        return LoadModel(self.grid, [""] * n_codes, ptr, cell.astype(np.int32), counts.astype(np.int64),
                         self.objects)


def predicted_loads(model: LoadModel, workload: Workload) -> np.ndarray:
    """``L(q)`` of each of the workload's queries under ``model`` (formula (8)): ``(m,)`` float64,
    expected keyword matches per arriving object reaching the query's region (its ``R_q`` at
    the plan's radius)."""
    owner = np.repeat(np.arange(len(workload.ids)), np.diff(workload.ptr))
    entry = model.entry_loads(owner, workload.code, workload.rects)
    return np.bincount(owner, weights=entry, minlength=len(workload.ids))
