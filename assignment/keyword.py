"""Baseline 1 of the paper (§5): queries distributed by keywords only.

Keywords are dealt to workers by decreasing total load (``sum_q P(R_q, key)`` over the queries
carrying it), each to the least-loaded worker (LPT). A query goes to the worker of its heaviest
keyword; a query whose keywords are all absent from the statistics goes to worker 0. Regions
play no part.
"""

from __future__ import annotations

import numpy as np

from knnmon.assignment.base import Assigner, Plan, QuerySet, lpt
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload

__all__ = ["KeywordAssigner"]


class KeywordAssigner(Assigner):
    """Keyword-only partitioning (one set per worker)."""

    name = "keyword"

    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        self.check_workers(workers)
        code, owner, load = workload.code, workload.owner, workload.entry_load
        known = code >= 0
        keys, inv = np.unique(code[known], return_inverse=True)
        key_load = np.bincount(inv, weights=load[known]) if len(keys) else np.zeros(0)
        key_worker = lpt(key_load, workers)
        entry_worker = np.zeros(len(code), dtype=np.int32)
        weight = np.full(len(code), -1.0)
        entry_worker[known] = key_worker[inv]
        weight[known] = key_load[inv]
        order = np.lexsort((-weight, owner))
        first = np.ones(len(order), dtype=bool)
        first[1:] = owner[order][1:] != owner[order][:-1]
        worker = np.zeros(len(workload), dtype=np.int32)
        worker[owner[order][first]] = entry_worker[order][first]
        sets = []
        for w in range(workers):
            members = np.flatnonzero(worker == w)
            top = keys[key_worker == w][np.argsort(-key_load[key_worker == w])][:3]
            sets.append(QuerySet(members, float(workload.load[members].sum()),
                                 [f"keyword: heaviest keyword on worker {w}: "
                                  f"{', '.join(workload.vocabulary[int(c)] for c in top) or '-'}"]))
        return self._plan_from_sets(workload, sets, np.arange(workers), workers, {})
