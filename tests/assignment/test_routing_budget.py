"""The routing table's entry bound (``RoutingTable.build(max_entries=...)``) on real places:
pairs sent everywhere keep it complete, and cost exactly the deliveries the model predicts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from knnmon.assignment import ProposedAssigner
from knnmon.assignment.loadmodel import QueryRects
from knnmon.assignment.routing import RoutingTable, _PairStats
from knnmon.assignment.summary import worker_deliveries
from knnmon.errors import InvalidArgumentError

WORKERS = 5


@pytest.fixture(scope="module")
def planned(setup):
    model, wl, stream = setup
    plan = ProposedAssigner().assign(wl, model, WORKERS)
    return model, wl, stream, plan, RoutingTable.build(wl, model, plan, max_entries=10**12)


def exact_deliveries(model, wl, plan) -> np.ndarray:
    """``D(w)`` from the model directly, per worker's entries (no routing table)."""
    w_of = plan.worker[wl.owner]
    return np.array([model.deliveries(wl.owner[w_of == w], wl.code[w_of == w], wl.rects) for w in range(WORKERS)])


def test_unbounded_table_holds_every_pair_as_cells(planned):
    model, wl, _, plan, table = planned
    assert table.stats["routing_pairs_promoted"] == 0
    assert table.stats["routing_pair_cells"] >= len(table.keys) > 0
    assert np.allclose(worker_deliveries(table, model, WORKERS), exact_deliveries(model, wl, plan), rtol=1e-9)


@pytest.mark.parametrize("share", [0.5, 0.1, 0.0])
def test_bounded_table_stays_complete_and_costs_what_the_model_says(planned, share,
                                                                    assert_routes_every_affected_worker):
    """``tiles=0``: the promoted pairs go everywhere, and cost exactly the model's price."""
    model, wl, stream, plan, unbounded = planned
    budget = int(unbounded.stats["routing_pair_cells"] * share)
    table = RoutingTable.build(wl, model, plan, max_entries=budget, tiles=0)
    assert len(table.keys) <= budget and len(table.regions) == 0
    assert table.stats["routing_pairs_promoted"] > 0
    if budget == 0:
        assert table.stats["routing_pairs_promoted"] == unbounded.stats["routing_pairs"]
    assert_routes_every_affected_worker(wl, plan, table, stream.slice(0, 3000))
    # Sending a pair everywhere adds P(key) - P(Cov, key) per object to its worker, as reported.
    added = worker_deliveries(table, model, WORKERS).sum() - worker_deliveries(unbounded, model, WORKERS).sum()
    assert added == pytest.approx(table.stats["routing_promoted_extra_deliveries"], rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("share", [0.5, 0.0])
def test_promoted_pairs_held_as_rectangles_stay_complete_and_cost_less(planned, share,
                                                                       assert_routes_every_affected_worker):
    """By default the promoted pairs are held as their queries' rectangles per tile: complete,
    within the bound, and fewer deliveries than sending them everywhere (the model's price)."""
    model, wl, stream, plan, unbounded = planned
    budget = int(unbounded.stats["routing_pair_cells"] * share)
    table = RoutingTable.build(wl, model, plan, max_entries=budget)
    assert len(table.keys) <= budget
    assert 0 < table.stats["routing_region_rects"] == len(table.regions)
    assert_routes_every_affected_worker(wl, plan, table, stream.slice(0, 3000))
    added = worker_deliveries(table, model, WORKERS).sum() - worker_deliveries(unbounded, model, WORKERS).sum()
    assert -1e-9 <= added < 0.5 * table.stats["routing_promoted_extra_deliveries"]
    # Each rectangle bounds regions of one worker's queries with its keyword.
    w_of = plan.worker[wl.owner]
    for i in np.random.default_rng(0).choice(len(table.regions), min(50, len(table.regions)), replace=False):
        r = table.regions
        mine = (wl.code == r.code[i]) & ((r.mask[i] >> w_of.astype(np.uint64)) & np.uint64(1) == 1)
        q = wl.owner[mine]
        assert len(q) and (wl.rects.x0[q] >= r.x0[i]).any() and (wl.rects.x1[q] <= r.x1[i]).any()


def test_the_pairs_with_fewest_extra_deliveries_per_cell_go_first():
    pairs = _PairStats()
    pairs.add(0, np.array([1, 2, 3]), np.array([100, 10, 50]), np.array([0.0, 0.5, 0.1]))
    pairs.add(1, np.array([1, 4]), np.array([1000, 40]), np.array([np.inf, 0.04]))
    # extra per cell: (0,1) 0, (0,3) 0.002, (1,4) 0.001, (0,2) 0.05, (1,1) inf
    worker, code = pairs.cheapest_to_drop(120)
    assert list(zip(worker.tolist(), code.tolist())) == [(0, 1), (1, 4)]
    assert pairs.promoted == 2 and pairs.promoted_extra == pytest.approx(0.04)
    worker, code = pairs.cheapest_to_drop(141)
    assert list(zip(worker.tolist(), code.tolist())) == [(0, 1), (1, 4), (0, 3)]
    assert _PairStats.masks((worker, code), 5).tolist() == [0, 0b01, 0, 0b01, 0b10]
    worker, code = pairs.cheapest_to_drop(10**6)  # more than all: everything, the unknown keyword last
    assert len(worker) == 5 and (worker[-1], code[-1]) == (1, 1) and pairs.promoted_extra == pytest.approx(0.64)


def test_a_pair_covering_every_cell_goes_to_always_without_cost(setup):
    """Two queries of one worker whose rectangles are the two halves of the grid: their shared
    keyword is routed everywhere with no cell entries, and deliveries do not change."""
    model, wl, _ = setup
    n = model.grid.n
    counts = np.bincount(wl.code, minlength=len(wl.vocabulary))
    code = int(np.flatnonzero(counts >= 2)[0])
    q0, q1 = np.unique(wl.owner[wl.code == code])[:2]
    x0, y0, x1, y1 = (r.copy() for r in (wl.rects.x0, wl.rects.y0, wl.rects.x1, wl.rects.y1))
    x0[[q0, q1]], x1[[q0, q1]] = (0, n // 2), (n // 2 - 1, n - 1)
    y0[[q0, q1]], y1[[q0, q1]] = 0, n - 1
    wl = dataclasses.replace(wl, rects=QueryRects(x0, y0, x1, y1))
    plan = ProposedAssigner().assign(wl, model, 1)
    table = RoutingTable.build(wl, model, plan)
    assert table.always[code] == 1 and table.stats["routing_pairs_full"] >= 1
    assert not ((table.keys // model.grid.n_cells) == code).any()
    assert worker_deliveries(table, model, 1)[0] == pytest.approx(model.deliveries(wl.owner, wl.code, wl.rects), rel=1e-9)


def test_a_negative_bound_is_rejected(planned):
    model, wl, _, plan, _ = planned
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        RoutingTable.build(wl, model, plan, max_entries=-1)
    with pytest.raises(InvalidArgumentError, match="tiles"):
        RoutingTable.build(wl, model, plan, max_entries=0, tiles=-1)
