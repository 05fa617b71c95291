"""The plan in Redis: what ``knnmon explain`` reads to say why a query is where it is.

``knn:plan`` (:class:`~knnmon.keys.Keys`) is a hash written when a run or service starts:
``algorithm``, ``workers``, ``queries``, and per query set ``set:<i>``, a JSON object with the
set's ``worker`` (-1: its queries were dealt out one by one), ``queries``, ``work`` (``L(Q)``,
Tsuruoka et al. 2019, formula (9)), ``region`` (degrees) and ``history`` (how the set came
about). Each query hash's ``set`` field names its set.
"""

from __future__ import annotations

import json

from knnmon.connection import connect, replace_hash
from knnmon.coordinator.planning import PlanResult
from knnmon.keys import Keys

__all__ = ["MAX_HISTORY", "record_plan"]

#: Steps of a set's history kept in Redis (the first ones).
MAX_HISTORY = 20


def record_plan(redis_url: str, namespace: str, plan: PlanResult) -> None:
    """Write ``knn:plan`` (module docstring), replacing an earlier one.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    p, keys = plan.plan, Keys(namespace)
    fields = {"algorithm": p.algorithm, "workers": str(p.workers), "queries": str(len(p.worker))}
    for i, s in enumerate(p.sets):
        fields[f"set:{i}"] = json.dumps({"worker": int(p.set_worker[i]), "queries": int(len(s.members)),
                                         "work": float(s.work), "region": [float(x) for x in s.region],
                                         "history": list(s.history[:MAX_HISTORY])})
    client = connect(redis_url)
    try:
        replace_hash(client, keys.plan, fields, "recording the plan", redis_url)
    finally:
        client.close()
