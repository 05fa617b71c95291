"""One conformance test for every assignment algorithm (and each of its parameter sets) on real places."""

from __future__ import annotations


import numpy as np
import pytest

from knnmon.assignment import ALGORITHMS
from knnmon.assignment.routing import RoutingTable

#: The parameter sets each algorithm runs with (its defaults unless named here).
PARAMS = {"proposed": [{}, {"beta": 50, "sets_per_worker": 4}, {"handout": "query"}],
          "random": [{"seed": 0}, {"seed": 1}]}
CASES = [(cls, params) for name, cls in ALGORITHMS.items() for params in PARAMS.get(name, [{}])]
IDS = [f"{cls.name}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}" for cls, p in CASES]


@pytest.mark.parametrize(("cls", "params"), CASES, ids=IDS)
@pytest.mark.parametrize("workers", [1, 5])
def test_every_query_assigned_once_and_deterministic(setup, cls, params, workers):
    model, wl, _ = setup
    plan = cls(**params).assign(wl, model, workers)
    assert plan.worker.shape == (len(wl),) and plan.worker.min() >= 0 and plan.worker.max() < workers
    members = np.concatenate([s.members for s in plan.sets])
    assert np.array_equal(np.sort(members), np.arange(len(wl)))  # the sets partition the queries
    for i, s in enumerate(plan.sets):
        assert (plan.set_of[s.members] == i).all()
        assert s.work == pytest.approx(wl.load[s.members].sum())
        if plan.set_worker[i] >= 0:
            assert (plan.worker[s.members] == plan.set_worker[i]).all()
    again = cls(**params).assign(wl, model, workers)
    assert np.array_equal(plan.worker, again.worker) and np.array_equal(plan.set_of, again.set_of)


@pytest.mark.parametrize(("cls", "params"), CASES, ids=IDS)
def test_routing_table_is_complete(setup, cls, params, assert_routes_every_affected_worker):
    """Brute force over 3,000 later objects: every worker with a query the object can affect is routed to."""
    model, wl, stream = setup
    plan = cls(**params).assign(wl, model, 7)
    table = RoutingTable.build(wl, model, plan)
    assert_routes_every_affected_worker(wl, plan, table, stream.slice(0, 3000))
