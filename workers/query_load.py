"""Each query's measured load on its worker, over recent batches: what re-balancing moves.

With ``--rebalance`` (the worker's ``track_load``), per batch the worker charges every query the work it caused, in the units of the measured cost
model (:mod:`knnmon.costs`: microseconds of a worker's busy time):

- ``candidate`` per candidate pair (object, query) the index gave;
- ``delivery`` per object delivered, shared among the queries it was a candidate of (an object
  that is a candidate of 5 of the worker's queries charges each a fifth): the deliveries a query
  would bring to another worker, at most;
- ``change`` per changed result.

The sums decay by half every :data:`HALF_LIFE` batches (one multiplication of the whole array
then, not per batch), so they follow a drifting stream (Tsuruoka et al. 2019 plan from the
initial objects only; CoDD, Anand & Chawathe, re-organises as the distribution drifts).
"""

from __future__ import annotations

import numpy as np

from knnmon.costs import CostModel
from knnmon.arrays import with_capacity

__all__ = ["HALF_LIFE", "QueryLoad"]

#: Batches after which a charge counts half: long enough that a move follows where the load
#: stays, not a burst of a few dozen batches (a half-life of 16 chased bursts: docs/rebalance.md).
HALF_LIFE = 64


class QueryLoad:
    """Decayed per-slot load (module docstring), aligned with the worker's query slots.

    Attributes
    ----------
    us : numpy.ndarray
        ``(slots,)`` float64: each slot's recent load (microseconds of busy time, decayed).
    batches : int
        Batches charged so far.
    """

    def __init__(self, cost: CostModel | None = None) -> None:
        self.cost = cost or CostModel.named("measured")
        self.us = np.zeros(0)
        self.batches = 0

    def extend(self, slots: int) -> None:
        """Room for ``slots`` slots in all (new slots start at 0)."""
        self.us = with_capacity(self.us, slots)

    def tick(self) -> None:
        """A batch begins (every :data:`HALF_LIFE` batches, the loads so far count half)."""
        self.batches += 1
        if self.batches % HALF_LIFE == 0:
            self.us *= 0.5

    def charge(self, cand_obj: np.ndarray, cand_slot: np.ndarray, changed: np.ndarray) -> None:
        """Charge the batch's candidate pairs ``(cand_obj, cand_slot)`` ``(c,)`` int64 (batch
        position, slot) and its ``changed`` slots ``(m,)`` int64."""
        if len(cand_slot):
            per_obj = np.bincount(cand_obj)
            weight = self.cost.candidate + self.cost.delivery / per_obj[cand_obj]
            top = int(cand_slot.max()) + 1
            self.extend(top)
            self.us[:top] += np.bincount(cand_slot, weights=weight, minlength=top)
        if len(changed):
            self.extend(int(changed.max()) + 1)
            self.us[changed] += self.cost.change

    def clear(self, slots: np.ndarray) -> None:
        """Forget the load of ``slots`` (removed or handed over)."""
        slots = np.asarray(slots, dtype=np.int64)
        self.us[slots[slots < len(self.us)]] = 0.0

    def keep(self, slots: np.ndarray) -> None:
        """The worker renumbered its slots: keep ``slots`` ``(m,)`` int64 (old numbers, in their
        new order), which become ``0..m-1``."""
        slots = np.asarray(slots, dtype=np.int64)
        self.extend(int(slots.max(initial=-1)) + 1)
        self.us = self.us[slots]
