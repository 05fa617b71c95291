"""Baseline 1 of the paper (§5): queries distributed by keywords only.

Keywords are dealt to workers by decreasing total load (``sum_q P(R_q, key)`` over the queries
carrying it), each to the least-loaded worker (LPT). A query goes to the worker of its heaviest
keyword (a keyword absent from the statistics has load 0). Regions play no part.
"""

from __future__ import annotations

import numpy as np

from knnmon.assignment.base import Assigner, Plan, QuerySet, deal_keywords
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload

__all__ = ["KeywordAssigner"]


class KeywordAssigner(Assigner):
    """Keyword-only partitioning (one set per worker)."""

    name = "keyword"

    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        self.check_workers(workers)
        keys, key_load, key_worker, queries, query_worker = deal_keywords(
            workload.owner, workload.code, workload.entry_load, workers)
        worker = np.zeros(len(workload), dtype=np.int32)
        worker[queries] = query_worker
        sets = []
        for w in range(workers):
            members = np.flatnonzero(worker == w)
            top = keys[key_worker == w][np.argsort(-key_load[key_worker == w])][:3]
            sets.append(QuerySet(members, float(workload.load[members].sum()),
                                 [f"keyword: heaviest keyword on worker {w}: "
                                  f"{', '.join(workload.vocabulary[int(c)] for c in top) or '-'}"]))
        return self._plan_from_sets(workload, sets, np.arange(workers), workers, {})
