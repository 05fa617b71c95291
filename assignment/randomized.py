"""Random assignment: the "straightforward approach" the paper improves on (§1, §5).

Each query goes to a worker drawn uniformly at random (numpy ``default_rng(seed)``).
"""

from __future__ import annotations


import numpy as np

from knnmon.assignment.base import Assigner, Plan, QuerySet
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload

__all__ = ["RandomAssigner"]


class RandomAssigner(Assigner):
    """Uniform random assignment, deterministic for a seed."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        self.check_workers(workers)
        worker = np.random.default_rng(self.seed).integers(0, workers, size=len(workload)).astype(np.int32)
        sets = [QuerySet(np.flatnonzero(worker == w), float(workload.load[worker == w].sum()),
                         [f"random: worker {w} drawn uniformly (seed {self.seed})"]) for w in range(workers)]
        return self._plan_from_sets(workload, sets, np.arange(workers), workers, {"seed": self.seed})
