"""A list's refill deadline (``WindowLists.deadlines``) is exactly the smallest cutoff at which the
worker's expiry asks to refill it: checked on random streams with tied distances, out-of-order
times and lists below ``k``, at every cutoff where the answer can change."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.query import QueryColumns
from knnmon.refills import NEVER
from knnmon.workers.settings import WorkerSettings
from knnmon.workers.worker import KnnWorker

#: Object positions on a small lattice east of each query (so that distances tie often).
SPOTS = 6
#: Whether an object matches the queries' keyword (mostly: so that lists fill and radii shrink).
CAFE = st.sampled_from([True, True, True, False])


@settings(max_examples=60, deadline=None)
@given(reserve=st.integers(0, 3), ks=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       objects=st.lists(st.tuples(st.integers(0, SPOTS - 1), st.integers(0, 40), CAFE), min_size=8, max_size=40))
def test_a_deadline_is_the_first_cutoff_that_asks_a_refill(reserve, ks, objects):
    w = KnnWorker(0, WorkerSettings(reserve=reserve))
    m = len(ks)
    q = QueryColumns([f"q{i}" for i in range(m)], np.full(m, -71.0), 42.0 + 0.1 * np.arange(m),
                     [("cafe",)] * m, np.asarray(ks, dtype=np.int64))
    w.load_queries(q, [[] for _ in range(m)], {}, vocabulary={"cafe": 0, "bar": 1})
    for b in range(0, len(objects), 7):  # batches of 7, times out of order
        part = objects[b:b + 7]
        n = len(part)
        lon = np.array([-71.0 + 0.001 * x for x, _, _ in part])
        lat = np.array([42.0 + 0.1 * (j % m) for j in range(b, b + n)])
        w.process_batch(b, [f"o{j}" for j in range(b, b + n)], lon, lat, np.array([10 * t for _, t, _ in part]),
                        [["cafe"] if cafe else ["bar"] for _, _, cafe in part])
    slots = np.arange(m)
    deadline, _ = w.window.deadlines(slots)
    times = np.unique(w.state.handles.t[w.state.lists.h[w.state.lists.h >= 0]])
    for cutoff in sorted({int(x) for t in times for x in (t - 1, t)}):
        asked = set(copy.deepcopy(w).expire(cutoff).ids)
        assert asked == {f"q{s}" for s in slots[deadline <= cutoff]}, (cutoff, deadline.tolist())
    assert all(d == NEVER or d in times for d in deadline.tolist())
