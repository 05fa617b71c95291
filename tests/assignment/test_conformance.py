"""One conformance test for every assignment algorithm (and each of its parameter sets) on real places."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from knnmon.assignment import ALGORITHMS, LoadModel, Workload
from knnmon.assignment.routing import RoutingTable
from knnmon.coordinator.plan import initial_objects, load_queries
from knnmon.geo import haversine_m
from knnmon.ingest.queries import read_objects
from knnmon.workers.object_index import ObjectIndex

INITIAL = 6000
CASES = [(cls, params) for cls in ALGORITHMS.values() for params in cls._unit_test_params()]
IDS = [f"{cls.name}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}" for cls, p in CASES]


@pytest.fixture(scope="module")
def setup(places_slice, slice_queries):
    model = LoadModel.from_ingest(str(places_slice))
    queries = load_queries(str(slice_queries))
    objects = initial_objects(str(places_slice), INITIAL)
    radius = ObjectIndex(objects).kth_distance_m(queries.column("lon").to_numpy(), queries.column("lat").to_numpy(),
                                                 queries.column("keywords"), queries.column("k").to_numpy())
    stream = read_objects(str(places_slice)).slice(INITIAL)
    return model, Workload.build(model, queries, radius), stream


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
def test_routing_table_is_complete(setup, cls, params):
    """Brute force over 3,000 later objects: every worker with a query the object can affect is routed to."""
    model, wl, stream = setup
    plan = cls(**params).assign(wl, model, 7)
    table = RoutingTable.build(wl, model, plan)
    objs = stream.slice(0, 3000)
    masks = table.route_objects(objs.column("lon").to_numpy(), objs.column("lat").to_numpy(), objs.column("keywords"))
    by_word = defaultdict(list)
    for q in range(len(wl)):
        for c in wl.code[wl.ptr[q]:wl.ptr[q + 1]]:
            by_word[wl.vocabulary[c]].append(q)
    by_word = {w: np.array(qs) for w, qs in by_word.items()}
    needed_pairs = 0
    for i, o in enumerate(objs.to_pylist()):
        cand = np.unique(np.concatenate([by_word.get(w, np.empty(0, np.int64)) for w in o["keywords"]] + [np.empty(0, np.int64)]))
        if not len(cand):
            continue
        d = haversine_m(o["lon"], o["lat"], wl.lon[cand], wl.lat[cand])
        affected = cand[d <= wl.radius_m[cand]]
        needed = np.uint64(0)
        for w in np.unique(plan.worker[affected]):
            needed |= np.uint64(1) << np.uint64(int(w))
        needed_pairs += len(affected)
        assert needed & ~masks[i] == 0, f"object {o['id']} not routed to every affected worker"
    assert needed_pairs > 100  # the check saw real (object, query) pairs
