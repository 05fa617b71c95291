"""The R-tree query index (``workers.index rtree``): its refreshes against a rebuilt index, the grid and
brute force, at several fanouts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.geo import haversine_m
from knnmon.workers.packed_rtree import PackedRTree
from knnmon.workers.query_index import QueryIndex, pretested
from knnmon.workers.rtree_index import RTreeIndex

from tests.workers.test_query_index import N_CODES, _State, _pairs, _reach


def _probe(rng: np.random.Generator, m: int = 200):
    """``m`` objects near the two clusters of :class:`_State` (one across the antimeridian and
    near the pole), two keyword codes each."""
    lon = np.r_[rng.uniform(-2, 2, m // 2), rng.uniform(177, 181, m // 2)]
    lon = (lon + 180.0) % 360.0 - 180.0
    lat = np.r_[rng.uniform(-2, 2, m // 2), rng.uniform(87, 90, m // 2)]
    return lon, lat, np.repeat(np.arange(m), 2), rng.integers(0, N_CODES, 2 * m)


def _exact(state: _State, lon, lat, pair_obj, pair_code) -> list[tuple[int, int]]:
    """Brute force: (object, slot) per shared keyword where the object is within ``r_q``."""
    out = []
    for o, c in zip(pair_obj.tolist(), pair_code.tolist()):
        for s in np.flatnonzero(state.alive).tolist():
            if c in state.codes[s] and haversine_m(lon[o], lat[o], state.lon[s], state.lat[s]) <= state.radius[s]:
                out.append((o, s))
    return sorted(out)


def _within(state: _State, lon, lat, pairs) -> list[tuple[int, int]]:
    return sorted((o, s) for o, s in pairs
                  if haversine_m(lon[o], lat[o], state.lon[s], state.lat[s]) <= state.radius[s])


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60),
       steps=st.lists(st.sampled_from(["shrink", "grow", "add", "remove"]), min_size=1, max_size=12),
       delta_min=st.sampled_from([1, 8, 1 << 16]))
def test_refresh_matches_a_rebuilt_index_the_grid_and_brute_force(seed, n, steps, delta_min):
    rng = np.random.default_rng(seed)
    state = _State(rng, n)
    index = RTreeIndex()
    index.DELTA_MIN = delta_min  # 1: a merge at every refresh; 1 << 16: never here
    if delta_min == 1:
        index.DELTA_SHARE = 1 << 40
    index.rebuild(*state.entries(np.arange(n)))
    for step in steps:
        live = np.flatnonzero(state.alive)
        if step == "add" or not len(live):
            changed = state.add(int(rng.integers(1, 6)))
        else:
            changed = rng.choice(live, size=min(len(live), int(rng.integers(1, 6))), replace=False)
            if step == "shrink":  # some a little (kept lazily), some a lot (re-indexed)
                state.radius[changed] = np.minimum(state.radius[changed],
                                                   state.radius[changed] * rng.choice([0.9, 0.01], len(changed)))
                state.radius[changed] = np.minimum(state.radius[changed], 10 ** rng.uniform(0, 6, len(changed)))
            elif step == "grow":  # a window's expiry: the region grows, at once
                state.radius[changed] = state.radius[changed] * rng.uniform(1.5, 20, len(changed))
            else:
                state.alive[changed] = False
        index.refresh(changed, *state.entries(changed))

        lon, lat, pair_obj, pair_code = _probe(rng)
        got = _pairs(*index.candidates(lon, lat, pair_obj, pair_code))
        codes = {o: set() for o in range(len(lon))}
        for o, c in zip(pair_obj.tolist(), pair_code.tolist()):
            codes[o].add(c)
        # Every candidate is a live query sharing a keyword (a stale box may hold more objects).
        assert all(state.alive[s] and codes[o] & set(state.codes[s]) for o, s in got), step
        want = _exact(state, lon, lat, pair_obj, pair_code)
        assert set(want) <= set(got), step
        assert sorted(set(_within(state, lon, lat, got))) == sorted(set(want)), step
        fresh = RTreeIndex()
        fresh.rebuild(*state.entries(np.arange(len(state.lon))))
        assert set(_within(state, lon, lat, _pairs(*fresh.candidates(lon, lat, pair_obj, pair_code)))) == set(want)
        grid = QueryIndex()
        grid.rebuild(*state.entries(np.arange(len(state.lon))))
        assert set(_within(state, lon, lat, _pairs(*grid.candidates(lon, lat, pair_obj, pair_code)))) == set(want)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), fanout=st.sampled_from([2, 4, 16]))
def test_every_fanout_finds_the_same_pairs_as_the_grid(seed, n, fanout):
    rng = np.random.default_rng(seed)
    state = _State(rng, n)
    index, grid = RTreeIndex(fanout=fanout), QueryIndex()
    index.DELTA_MIN = 1 << 20
    index.rebuild(*state.entries(np.arange(n)))
    extra = state.add(int(rng.integers(0, 20)))  # some in the delta tree too
    index.refresh(extra, *state.entries(extra))
    grid.rebuild(*state.entries(np.arange(len(state.lon))))
    lon, lat, pair_obj, pair_code = _probe(rng, 120)
    obj, slot = index.candidates(lon, lat, pair_obj, pair_code)
    got = _within(state, lon, lat, _pairs(obj, slot))
    assert got == _within(state, lon, lat, _pairs(*grid.candidates(lon, lat, pair_obj, pair_code)))
    assert got == _exact(state, lon, lat, pair_obj, pair_code)
    # With the slots' reach, the pairs that pass the pre-test, every pair found counted.
    reach = _reach(state)
    assert _pairs(*index.candidates(lon, lat, pair_obj, pair_code, reach)) == _pairs(*pretested(lon, lat, obj, slot,
                                                                                                reach))
    assert index.found == len(obj)


def test_packed_rtree_search_against_brute_force():
    rng = np.random.default_rng(3)
    n = 3000
    x0, y0 = rng.uniform(-10, 10, n), rng.uniform(-10, 10, n)
    x1, y1 = x0 + rng.exponential(2.0, n), y0 + rng.exponential(2.0, n)
    code = rng.integers(0, 7, n)
    t = PackedRTree(x0, y0, x1, y1, code, fanout=4)
    px, py, pc = rng.uniform(-10, 11, 500), rng.uniform(-10, 11, 500), rng.integers(0, 8, 500)
    pair, entry = t.search(px, py, pc)
    got = sorted(zip(pair.tolist(), entry.tolist()))
    inside = ((x0 <= px[:, None]) & (px[:, None] <= x1) & (y0 <= py[:, None]) & (py[:, None] <= y1)
              & (code == pc[:, None]))
    assert got == sorted(zip(*(a.tolist() for a in np.nonzero(inside)))) and len(got) > 100
    assert PackedRTree([], [], [], [], []).search(px, py, pc)[0].size == 0
    with pytest.raises(ValueError):
        PackedRTree([0.0], [0.0], [1.0], [1.0], [1, 2])
