"""Next lists (:mod:`knnmon.workers.next_lists`): the run-out cutoff of a list, a worker naming
the lists due, keeping the next list it is sent, merging a batch's objects into it, and taking it
at the expiry that empties its list only once the cutoff has reached its floor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from knnmon.batch import KnnColumns, ObjectColumns, ObjectInfo, Refills
from knnmon.geo import haversine_m
from knnmon.query import Query, QueryColumns
from knnmon.workers.next_lists import NEXT_CAP, run_out
from knnmon.workers.worker import KnnWorker


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-5, 30)), max_size=40), st.integers(1, 4))
def test_run_out_is_the_kth_largest_time_of_each_list(entries, k):
    entries.sort(key=lambda e: e[0])
    slot = np.array([s for s, _ in entries], dtype=np.int64)
    t = np.array([x for _, x in entries], dtype=np.int64)
    got = run_out(slot, t, np.full(len(slot), k, dtype=np.int64))
    want = []
    for s in sorted(set(slot.tolist())):
        times = sorted((x for u, x in entries if u == s), reverse=True)
        want.append(times[k - 1] if len(times) >= k else np.iinfo(np.int64).min)
    assert got.tolist() == want
    for s, end in zip(sorted(set(slot.tolist())), got.tolist()):  # at that cutoff, fewer than k stay live
        times = [x for u, x in entries if u == s]
        if end > np.iinfo(np.int64).min:
            assert sum(x > end for x in times) < k <= sum(x > end - 1 for x in times)


LON, LAT = -71.5, 43.0
EAST = {"a": 100, "b": 200, "c": 300, "e": 250}  # meters east of the query (about)
TIME = {"a": 10, "b": 20, "c": 50, "e": 60}


def _object(oid: str) -> tuple[float, float, ObjectInfo]:
    lon = LON + EAST[oid] / 81_430.0
    return lon, LAT, ObjectInfo(lon, LAT, TIME[oid], ["coffee"])


def _d(oid: str) -> float:
    lon, lat, _ = _object(oid)
    return float(haversine_m(np.array([lon]), np.array([lat]), np.array([LON]), np.array([LAT]))[0])


@pytest.mark.parametrize("floor, taken", [(10, True), (100, False)])
def test_a_next_list_replaces_the_list_it_follows_only_from_its_floor_on(floor, taken):
    """One query (k 1, reserve 1) holding a (t 10) and b (t 20, at its radius): it runs out at
    cutoff 10. Its next list [b, c] (the objects above the floor) is sent with a batch bringing e,
    which joins the next list (within its radius, not within the list's). At cutoff 15 the list
    runs out: with floor 10 the next list is ready, its first k + reserve live entries [b, e]
    become the list (full: r_q at e) and no refill is asked;
    with floor 100 (e, below it, is not merged) the objects between the cutoff and the floor are
    not in it, so it is refilled."""
    w = KnnWorker(0, None, reserve=1)
    infos = {o: _object(o)[2] for o in "ab"}
    w.load_queries(QueryColumns.of([Query.create("q", LON, LAT, ["coffee"], 1)]), [[("a", _d("a")), ("b", _d("b"))]],
                   infos, write=False)
    need, due, floors = w.expire(5, 10)
    assert len(need.ids) == 0 and list(due.ids) == ["q"] and floors.tolist() == [10]  # a's time: b is at r_q
    nxt = ObjectColumns(["b", "c"], [_object(o)[0] for o in "bc"], [LAT, LAT], [TIME["b"], TIME["c"]],
                        [["coffee"], ["coffee"]])
    ahead = Refills(["q"], KnnColumns([2], ["b", "c"], [_d("b"), _d("c")], [0, 1]), nxt, np.array([floor]))
    lon_e, lat_e, _ = _object("e")
    w.process_batch(0, ["e"], np.array([lon_e]), np.array([lat_e]), np.array([TIME["e"]]), [["coffee"]], ahead=ahead)
    assert w.result("q") == [("a", _d("a"))]  # e is beyond the list's radius
    # e joins the next list above floor 10, not above floor 100; it has room for both (NEXT_CAP
    # times k + reserve places), so its radius stays inf: every matching object above its floor
    assert NEXT_CAP * 2 >= 3
    assert len(w.next) == 1 and w.next.count[0] == (3 if taken else 2) and w.next.radius[0] == np.inf
    need = w.expire(15)
    if taken:
        assert len(need.ids) == 0 and w.next_used == 1 and len(w.next) == 0
        assert w.result("q") == [("b", _d("b"))]
        assert w.queries.radius[0] == pytest.approx(_d("e"))
        assert sorted(w.handles.names(w.lists.h[:int(w.lists.count[0])])) == ["b", "e"]
    else:
        assert list(need.ids) == ["q"] and w.next_used == 0 and len(w.next) == 1


def test_the_horizon_is_bounded_by_the_window_and_needs_a_reserve():
    from knnmon.coordinator.runtime.config import DEFAULT_REFILL_AHEAD_MS, RunConfig
    from knnmon.errors import InvalidArgumentError

    assert RunConfig(window=600_000).ahead_ms == DEFAULT_REFILL_AHEAD_MS
    assert RunConfig(window=10_000).ahead_ms == 10_000  # (capped at the window)
    assert RunConfig(window=600_000, refill_ahead_ms=0).ahead_ms is None
    assert RunConfig(window=600_000, reserve=0).ahead_ms is None  # (next lists' details are the reserve's)
    assert RunConfig().ahead_ms is None
    for bad in (dict(window=600_000, refill_ahead_ms=600_001), dict(window=600_000, refill_ahead_ms=-1),
                dict(refill_ahead_ms=1000)):
        with pytest.raises(InvalidArgumentError, match="--refill-ahead"):
            RunConfig(**bad)
