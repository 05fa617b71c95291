"""Property tests (hypothesis) for Algorithm 1's partition and Algorithm 2's greedy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.assignment.base import lpt
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.proposed import ProposedAssigner
from knnmon.assignment.workload import Workload
from knnmon.grid import Grid

WORDS = ["a", "b", "c", "d", "e", "f", "g"]


def random_model(rng: np.random.Generator, n: int) -> LoadModel:
    grid = Grid(0.0, 0.0, 10.0, 10.0, n)
    ptr, cells, counts = [0], [], []
    for _ in WORDS:
        c = np.sort(rng.choice(n * n, size=int(rng.integers(1, n * n + 1)), replace=False))
        cells.append(c)
        counts.append(rng.integers(1, 50, size=len(c)))
        ptr.append(ptr[-1] + len(c))
    counts_all = np.concatenate(counts)
    return LoadModel(grid, WORDS, np.array(ptr), np.concatenate(cells).astype(np.int32), counts_all,
                     int(counts_all.sum()))


@st.composite
def workloads(draw):
    seed = draw(st.integers(0, 2**31))
    m = draw(st.integers(1, 300))
    rng = np.random.default_rng(seed)
    model = random_model(rng, draw(st.integers(1, 12)))
    kws = [sorted(set(rng.choice(WORDS + ["zz"], size=int(rng.integers(1, 4))).tolist())) for _ in range(m)]
    lon = rng.uniform(0, 10, m).round(draw(st.integers(0, 3)))  # rounding makes shared locations
    lat = rng.uniform(0, 10, m).round(2)
    table = pa.table({"id": [f"q{i}" for i in range(m)], "lon": lon, "lat": lat,
                      "keywords": pa.array(kws, type=pa.list_(pa.string())), "k": np.ones(m, dtype=np.int32)})
    radius = np.where(rng.random(m) < 0.1, np.inf, rng.uniform(0, 300_000, m))
    return model, Workload.build(model, table, radius)


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(1, 9), st.integers(1, 400), st.integers(1, 6))
def test_partition_invariants(data, workers, beta, per_worker):
    model, wl = data
    algo = ProposedAssigner(beta=beta, sets_per_worker=per_worker)
    sets = algo.partition(wl, model, per_worker * workers)
    members = np.concatenate([s.members for s in sets])
    assert np.array_equal(np.sort(members), np.arange(len(wl)))          # disjoint and complete
    assert len(sets) <= max(per_worker * workers, 1) + 3                  # a split adds at most 3 sets
    assert abs(sum(s.work for s in sets) - wl.load.sum()) <= 1e-9 * max(1.0, wl.load.sum())
    for s in sets:
        if s.history and s.history[-1].startswith("space"):
            x0, y0, x1, y1 = s.region                                     # a space child is inside its quadrant
            assert ((wl.lon[s.members] >= x0) & (wl.lon[s.members] <= x1)).all()
            assert ((wl.lat[s.members] >= y0) & (wl.lat[s.members] <= y1)).all()
    plan = algo.assign(wl, model, workers)
    assert set(np.unique(plan.worker)) <= set(range(workers))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1000), min_size=1, max_size=60), st.integers(1, 12))
def test_lpt_bound(costs, workers):
    """Greedy list scheduling: the busiest worker is at most the mean plus the largest item."""
    costs = np.array(costs)
    w = lpt(costs, workers)
    loads = np.bincount(w, weights=costs, minlength=workers)
    assert loads.max() <= costs.sum() / workers + costs.max() + 1e-9
    assert np.array_equal(w, lpt(costs, workers))
