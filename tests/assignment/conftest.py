"""The assignment tests' workload: the places slice, its queries and their kNN radii."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from knnmon.assignment import LoadModel, Workload
from knnmon.assignment.base import Plan
from knnmon.assignment.routing import RoutingTable
from knnmon.geo import haversine_m
from knnmon.coordinator.runtime.object_index import ObjectIndex
from knnmon.ingest.reading import initial_objects, load_queries, read_objects

INITIAL = 6000


@pytest.fixture(scope="module")
def setup(places_slice, slice_queries):
    model = LoadModel.from_ingest(str(places_slice))
    queries = load_queries(str(slice_queries))
    objects = initial_objects(str(places_slice), INITIAL)
    radius = ObjectIndex(objects).kth_distance_m(queries.column("lon").to_numpy(), queries.column("lat").to_numpy(),
                                                 queries.column("keywords"), queries.column("k").to_numpy())
    stream = read_objects(str(places_slice)).slice(INITIAL)
    return model, Workload.build(model, queries, radius), stream


@pytest.fixture
def assert_routes_every_affected_worker():
    """The check below, as a fixture (test modules do not import from conftest)."""
    return _assert_routes_every_affected_worker


def _assert_routes_every_affected_worker(wl: Workload, plan: Plan, table: RoutingTable, objs: pa.Table) -> None:
    """Brute force: every worker with a query that an object of ``objs`` can affect (shares a
    keyword, within ``r_q``) is in the object's routing mask."""
    masks = table.route_objects(objs.column("lon").to_numpy(), objs.column("lat").to_numpy(), objs.column("keywords"))
    by_word = defaultdict(list)
    for q in range(len(wl)):
        for c in wl.code[wl.ptr[q]:wl.ptr[q + 1]]:
            by_word[wl.vocabulary[c]].append(q)
    by_word = {w: np.array(qs) for w, qs in by_word.items()}
    needed_pairs = 0
    for i, o in enumerate(objs.to_pylist()):
        cand = np.unique(np.concatenate([by_word.get(w, np.empty(0, np.int64)) for w in o["keywords"]]
                                        + [np.empty(0, np.int64)]))
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
