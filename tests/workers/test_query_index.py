"""The query index's incremental refresh (base + delta runs, superseded entries skipped, merges)
against an index rebuilt from scratch, and its candidates against the exact region test."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.geo import chord2_bound, haversine_m, unit_vectors
from knnmon.workers import kernels
from knnmon.workers.query_index import QueryIndex

N_CODES = 4


def _pairs(obj: np.ndarray, slot: np.ndarray) -> list[tuple[int, int]]:
    return sorted(zip(obj.tolist(), slot.tolist()))


class _State:
    """Queries as the worker holds them: per slot a location, radius, keyword codes, alive flag."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self.rng = rng
        self.lon, self.lat = np.empty(0), np.empty(0)
        self.radius, self.alive, self.codes = np.empty(0), np.empty(0, bool), []
        self.add(n)

    def add(self, n: int) -> np.ndarray:
        rng, first = self.rng, len(self.lon)
        self.lon = np.r_[self.lon, rng.uniform(-1, 1, n) + rng.choice([0.0, 179.0], n)]
        self.lat = np.r_[self.lat, rng.uniform(-1, 1, n) + rng.choice([0.0, 88.5], n)]
        # Radii from metres to continents, and inf (a query with fewer than k results).
        self.radius = np.r_[self.radius, np.where(rng.random(n) < 0.1, np.inf, 10 ** rng.uniform(1, 6.5, n))]
        self.alive = np.r_[self.alive, np.ones(n, bool)]
        self.codes += [sorted(set(rng.integers(0, N_CODES, rng.integers(1, 3)).tolist())) for _ in range(n)]
        return np.arange(first, first + n)

    def entries(self, slots: np.ndarray):
        slots = [s for s in slots.tolist() if self.alive[s]]
        slot = np.array([s for s in slots for _ in self.codes[s]], dtype=np.int64)
        code = np.array([c for s in slots for c in self.codes[s]], dtype=np.int64)
        return slot, code, self.lon[slot], self.lat[slot], self.radius[slot]


def _reach(state: _State) -> np.ndarray:
    """The worker's ``QueryTable.reach`` of ``state``: unit vector and chord bound, ``-1`` once removed."""
    bound = np.where(state.alive, chord2_bound(state.radius), -1.0)
    return np.column_stack([unit_vectors(state.lon, state.lat), bound])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60),
       steps=st.lists(st.sampled_from(["shrink", "grow", "add", "remove"]), min_size=1, max_size=12),
       delta_min=st.sampled_from([1, 8, 1 << 16]), share=st.sampled_from([1, 16, 1 << 40]),
       part=st.sampled_from([1, 16, 1 << 16]))
def test_refresh_equals_rebuild(seed, n, steps, delta_min, share, part):
    rng = np.random.default_rng(seed)
    state = _State(rng, n)
    index = QueryIndex()
    index.DELTA_MIN = delta_min  # 1: the delta moves to the middle run at every refresh; 1 << 16: never here
    index.DELTA_SHARE = share  # 1: the middle run waits for the base's size; 1 << 40: merged at once
    index.PART_ENTRIES = part  # 1: a fold is under way over many refreshes; 1 << 16: one part, folded at once
    index.rebuild(*state.entries(np.arange(n)))
    for step in steps:
        live = np.flatnonzero(state.alive)
        if step == "add" or not len(live):
            changed = state.add(int(rng.integers(1, 6)))
        else:
            changed = rng.choice(live, size=min(len(live), int(rng.integers(1, 6))), replace=False)
            if step == "shrink":
                state.radius[changed] = np.minimum(state.radius[changed], 10 ** rng.uniform(0, 5, len(changed)))
            elif step == "grow":  # (a refill)
                state.radius[changed] *= 10 ** rng.uniform(0, 2, len(changed))
            else:
                state.alive[changed] = False
        index.refresh(changed, *state.entries(changed))

        fresh = QueryIndex()
        fresh.rebuild(*state.entries(np.arange(len(state.lon))))
        m = 200
        lon = np.r_[rng.uniform(-2, 2, m // 2), rng.uniform(177, 181, m // 2)]
        lon = (lon + 180.0) % 360.0 - 180.0
        lat = np.r_[rng.uniform(-2, 2, m // 2), rng.uniform(87, 90, m // 2)]
        pair_obj = np.repeat(np.arange(m), 2)
        pair_code = rng.integers(0, N_CODES, 2 * m)
        obj, slot = index.candidates(lon, lat, pair_obj, pair_code)
        got = _pairs(obj, slot)
        assert got == _pairs(*fresh.candidates(lon, lat, pair_obj, pair_code)), step
        # Pre-tested as found: the pairs that pass the worker's chord pre-test, all counted.
        reach = _reach(state)
        u = unit_vectors(lon, lat)
        keep = kernels.chord_pretest(*(np.ascontiguousarray(u[:, i]) for i in range(3)), obj, slot, reach)
        assert _pairs(*index.candidates(lon, lat, pair_obj, pair_code, reach)) == _pairs(obj[keep], slot[keep])
        assert index.found == len(obj)
        assert index.entries >= fresh.entries  # superseded entries wait for a merge

        # No candidate is missed: every live query within r_q of an object sharing a keyword.
        obj_code = {(o, c) for o, c in zip(pair_obj.tolist(), pair_code.tolist())}
        got_set = set(got)
        for s in np.flatnonzero(state.alive).tolist():
            d = haversine_m(lon, lat, np.full(m, state.lon[s]), np.full(m, state.lat[s]))
            for o in np.flatnonzero(d <= state.radius[s]).tolist():
                if any((o, c) in obj_code for c in state.codes[s]):
                    assert (o, s) in got_set, (o, s, step)


def test_merge_drops_superseded_entries():
    state = _State(np.random.default_rng(1), 50)
    state.radius[:] = 5_000.0
    index = QueryIndex()
    index.rebuild(*state.entries(np.arange(50)))
    before = index.entries
    shrunk = np.arange(0, 50, 2)
    state.radius[shrunk] = 50.0
    index.refresh(shrunk, *state.entries(shrunk))
    assert index.compactions == 0 and index.entries > before  # new entries in the delta, old ones kept
    index.DELTA_MIN = 1
    index.PART_ENTRIES = 8  # (takes effect at the rebuild below: the base in parts of about 8 entries)
    state.radius[shrunk] = 5_000.0
    index.rebuild(*state.entries(np.arange(50)))
    state.radius[shrunk] = 50.0
    index.refresh(shrunk, *state.entries(shrunk))
    parts = len(index._base.parts)
    state.radius[1] = 40.0
    index.refresh(np.array([1]), *state.entries(np.array([1])))  # a fold starts: one part per refresh
    assert parts > 2 and index.compactions == 0
    none = np.empty(0, np.int64)
    for _ in range(parts):
        if index.compactions:
            break
        index.refresh(none, none, none, np.empty(0), np.empty(0), np.empty(0))
    fresh = QueryIndex()
    fresh.rebuild(*state.entries(np.arange(50)))
    assert index.compactions == 1 and index.entries == fresh.entries
    n = min(len(index._levels), len(fresh._levels))  # the level counts dropped the superseded entries
    assert (index._levels[:n] == fresh._levels[:n]).all() and not index._levels[n:].any()


def test_a_region_listed_in_the_same_cells_keeps_its_entries():
    """Most shrinks leave a query's region in the cells it is listed in: its entries stay, none
    is added or superseded, and the candidates are those of an index built anew."""
    state = _State(np.random.default_rng(4), 40)
    state.radius[:] = 5_000.0
    index = QueryIndex()
    index.rebuild(*state.entries(np.arange(40)))
    before = index.entries
    state.radius[:20] = 4_999.999  # (the same cells)
    state.radius[20:] = 5.0  # (smaller cells: new entries)
    index.refresh(np.arange(40), *state.entries(np.arange(40)))
    fresh = QueryIndex()
    fresh.rebuild(*state.entries(np.arange(40)))
    slot, code, lon, lat, radius = state.entries(np.arange(20))
    added = fresh.entries - fresh._grid_entries(slot, code, fresh._cover(lon, lat, radius)[0])[0].size
    assert index.entries == before + added
    rng = np.random.default_rng(5)
    lon, lat = rng.uniform(-1, 1, 300), rng.uniform(-1, 1, 300)
    pair_obj, pair_code = np.arange(300), rng.integers(0, N_CODES, 300)
    assert _pairs(*index.candidates(lon, lat, pair_obj, pair_code)) == _pairs(*fresh.candidates(lon, lat, pair_obj,
                                                                                                  pair_code))


def test_pickled_index_answers_the_same():
    """A worker's state travels pickled (Ray); the query index answers the same after it."""
    import pickle

    from knnmon.workers.query_index import LEVELS

    state = _State(np.random.default_rng(2), 80)  # 10 % of the radii are inf: entries at the top levels
    index = QueryIndex()
    index.rebuild(*state.entries(np.arange(80)))
    assert index._levels[:, LEVELS - 2:].any()
    rng = np.random.default_rng(3)
    lon, lat = rng.uniform(-2, 2, 100), rng.uniform(-2, 2, 100)
    pair_obj, pair_code = np.arange(100), rng.integers(0, N_CODES, 100)
    copy = pickle.loads(pickle.dumps(index))
    assert _pairs(*copy.candidates(lon, lat, pair_obj, pair_code)) == _pairs(*index.candidates(lon, lat, pair_obj,
                                                                                                  pair_code))
