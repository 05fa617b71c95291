"""The load model on small hand-computed cases, and the completeness of ``R_q`` (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload
from knnmon.geo import EARTH_RADIUS_M, haversine_m
from knnmon.grid import Grid

# A 4 x 4 grid of 1-degree cells over [0, 4] x [0, 4]; N = 8 objects seen, of which:
#   cell (0,0): 2 with "a";  cell (1,0): 1 with "a";  cell (3,3): 1 with "b", 1 with "a".
GRID = Grid(0.0, 0.0, 4.0, 4.0, 4)


def tiny_model() -> LoadModel:
    # CSR by keyword code: a -> cells 0, 1, 15 (counts 2, 1, 1); b -> cell 15 (count 1).
    return LoadModel(GRID, ["a", "b"], np.array([0, 3, 4]), np.array([0, 1, 15, 15], dtype=np.int32),
                     np.array([2, 1, 1, 1]), n_objects=8)


def queries(rows):
    return pa.table({"id": [f"q{i}" for i in range(len(rows))], "lon": [r[0] for r in rows],
                     "lat": [r[1] for r in rows], "keywords": [r[2] for r in rows], "k": [1] * len(rows)},
                    schema=pa.schema([("id", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()),
                                      ("keywords", pa.list_(pa.string())), ("k", pa.int32())]))


def test_query_loads_by_hand():
    m = tiny_model()
    wl = Workload.build(m, queries([(0.5, 0.5, ["a"]), (0.5, 0.5, ["a", "b"]), (1.5, 0.5, ["a", "zzz"]),
                                    (2.5, 2.5, ["b"])]),
                        np.array([1000.0, np.inf, 1000.0, 1000.0]))
    # q0: R = cell (0,0): P = 2/8.  q1: R = all cells: a 4/8 + b 1/8.  q2: cell (1,0): a 1/8, zzz 0.
    # q3: cell (2,2): no "b" there.
    assert wl.load.tolist() == pytest.approx([2 / 8, 5 / 8, 1 / 8, 0.0])
    assert wl.vocabulary == ["a", "b", "zzz"]  # zzz is routed, with probability 0


def test_deliveries_count_the_union_of_regions_once():
    m = tiny_model()
    wl = Workload.build(m, queries([(0.5, 0.5, ["a"]), (0.6, 0.6, ["a"]), (1.5, 0.5, ["a"]), (3.5, 3.5, ["b"])]),
                        np.full(4, 1000.0))
    assert wl.deliveries(m, np.array([0, 1])) == pytest.approx(2 / 8)          # same cell twice: once
    assert wl.deliveries(m, np.array([0, 2])) == pytest.approx(3 / 8)          # cells (0,0) + (1,0)
    assert wl.deliveries(m, np.array([0, 2, 3])) == pytest.approx(4 / 8)       # + "b" in (3,3)
    assert wl.deliveries(m, np.array([3])) == pytest.approx(1 / 8)             # "a" in (3,3) not routed to q3


def test_rects_widen_to_full_longitude_at_poles_and_the_antimeridian():
    m = LoadModel(Grid(-180.0, -90.0, 180.0, 90.0, 36), ["a"], np.array([0, 1]), np.array([0], dtype=np.int32),
                  np.array([1]), 1)
    r = m.rects(np.array([10.0, 179.99, 10.0, 10.0]), np.array([89.99, 0.0, 0.0, 0.0]),
                np.array([5_000.0, 5_000.0, np.inf, 5_000.0]))
    full = (r.x0 == 0) & (r.x1 == 35)
    assert full.tolist() == [True, True, True, False]
    assert (r.y1[0], r.y0[2], r.y1[2]) == (35, 0, 35)


def destination(lon, lat, bearing_deg, dist_m):
    """Point at ``dist_m`` from (lon, lat) along a bearing (spherical)."""
    d = dist_m / EARTH_RADIUS_M
    phi, lam, th = math.radians(lat), math.radians(lon), math.radians(bearing_deg)
    phi2 = math.asin(math.sin(phi) * math.cos(d) + math.cos(phi) * math.sin(d) * math.cos(th))
    lam2 = lam + math.atan2(math.sin(th) * math.sin(d) * math.cos(phi), math.cos(d) - math.sin(phi) * math.sin(phi2))
    return (math.degrees(lam2) + 540) % 360 - 180, math.degrees(phi2)


@settings(max_examples=400, deadline=None)
@given(st.floats(-180, 180), st.floats(-89.9, 89.9), st.floats(1, 3_000_000), st.floats(0, 360), st.floats(0, 1),
       st.integers(2, 64))
def test_every_point_within_r_lies_in_a_cell_of_R_q(lon, lat, r, bearing, frac, n):
    """Routing completeness rests on this: an object within r_q of q is in a cell of R_q."""
    m = LoadModel(Grid(-180.0, -90.0, 180.0, 90.0, n), ["a"], np.array([0, 1]), np.array([0], dtype=np.int32),
                  np.array([1]), 1)
    plon, plat = destination(lon, lat, bearing, r * frac)
    assert haversine_m(lon, lat, plon, plat) <= r * (1 + 1e-9) + 1e-3
    rect = m.rects(np.array([lon]), np.array([lat]), np.array([r]))
    cx, cy = m.grid.cell_xy(np.array([plon]), np.array([plat]))
    assert rect.x0[0] <= cx[0] <= rect.x1[0] and rect.y0[0] <= cy[0] <= rect.y1[0]


def test_measured_cost_model_weighs_candidates_and_expected_changes():
    from knnmon.costs import CostModel
    from knnmon.errors import InvalidArgumentError

    m = tiny_model()
    table = queries([(0.5, 0.5, ["a"]), (0.5, 0.5, ["a", "b"])])
    radius = np.array([1000.0, np.inf])
    rate = np.array([1 / 8, 3 / 8])  # count_q / N0
    costs = CostModel.named("measured")
    wl = Workload.build(m, table, radius, costs=costs, change_rate=rate)
    assert wl.load.tolist() == pytest.approx([0.036 * 2 / 8 + 33 * 1 / 8, 0.036 * 5 / 8 + 33 * 3 / 8])
    assert wl.entry_p.tolist() == pytest.approx([2 / 8, 4 / 8, 1 / 8])  # P(R_q, key) kept for --explain
    assert wl.entry_load.sum() == pytest.approx(wl.load.sum())
    assert CostModel.named("paper").delivery == 1.0 and CostModel.named("measured", 2.5).delivery == 2.5
    with pytest.raises(InvalidArgumentError, match="needs 2 change rates"):
        Workload.build(m, table, radius, costs=costs)
    with pytest.raises(InvalidArgumentError, match="Invalid cost model"):
        CostModel.named("guess")


def test_entry_loads_cell_by_cell_equal_the_summed_area_tables(setup):
    """On real places: P(R_q, key) of every entry by testing rows against rectangles (sparse),
    through summed-area tables (dense), or mixed (the default threshold): the same."""
    model, wl, _ = setup
    dense = model.entry_loads(wl.owner, wl.code, wl.rects, sparse_pairs=-1)
    sparse = model.entry_loads(wl.owner, wl.code, wl.rects, sparse_pairs=1 << 62)
    mixed = model.entry_loads(wl.owner, wl.code, wl.rects)
    assert dense.sum() > 0 and sparse == pytest.approx(dense, rel=1e-9, abs=1e-15)
    assert mixed == pytest.approx(dense, rel=1e-9, abs=1e-15)
    codes, n = np.unique(wl.code[(wl.code >= 0) & (wl.code < len(model.keywords))], return_counts=True)
    pairs = (model.ptr[codes + 1] - model.ptr[codes]) * n
    assert (pairs <= 4096).any() and (pairs > 4096).any()  # the default took both ways


def test_deliveries_cell_by_cell_equal_the_coverage_arrays(setup):
    """On real places: pricing every keyword cell by cell (sparse), through coverage arrays
    (dense) or mixed (the default threshold) gives the same D(S), for random query sets."""
    model, wl, _ = setup
    rng = np.random.default_rng(7)
    mixed_seen = False
    for size in (1, 10, 300, len(wl)):
        q = np.sort(rng.choice(len(wl), size, replace=False))
        e = wl.entries(q)
        owner, code = wl.owner[e], wl.code[e]
        dense = model.deliveries(owner, code, wl.rects, sparse_pairs=0)
        sparse = model.deliveries(owner, code, wl.rects, sparse_pairs=1 << 62)
        assert dense > 0 and sparse == pytest.approx(dense, rel=1e-12)
        assert model.deliveries(owner, code, wl.rects) == pytest.approx(dense, rel=1e-12)
        codes, n = np.unique(code[code < len(model.keywords)], return_counts=True)
        pairs = (model.ptr[codes + 1] - model.ptr[codes]) * n
        mixed_seen |= bool((pairs <= 4096).any() and (pairs > 4096).any())
    assert mixed_seen  # the default threshold took both ways on some set


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_rects=st.integers(1, 60), n_codes=st.integers(1, 700))
def test_coverage_equals_the_union_of_rectangles_cell_by_cell(seed, n_rects, n_codes):
    """Each keyword's covered cells, over its own window, are exactly the union of its
    rectangles; keywords of many chunks and heights, full-grid ones apart."""
    from knnmon.assignment.loadmodel import QueryRects

    rng = np.random.default_rng(seed)
    n = 16
    model = LoadModel(Grid(-10.0, -10.0, 10.0, 10.0, n), [], np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                      np.zeros(0, dtype=np.int64), 1)
    x0 = rng.integers(0, n, n_rects)
    y0 = rng.integers(0, n, n_rects)
    x1 = np.minimum(x0 + rng.integers(0, n, n_rects) * (rng.random(n_rects) < 0.3), n - 1)
    y1 = np.minimum(y0 + rng.integers(0, 4, n_rects), n - 1)
    x0[0], y0[0], x1[0], y1[0] = 0, 0, n - 1, n - 1  # a rectangle spanning the grid
    rects = QueryRects(x0, y0, x1, y1)
    e = rng.integers(0, n_rects, 3 * n_codes)
    code = rng.integers(-1, n_codes, len(e))
    want: dict[int, set] = {}
    for q, c in zip(e.tolist(), code.tolist()):
        if c >= 0:
            want.setdefault(c, set()).update((x, y) for x in range(x0[q], x1[q] + 1) for y in range(y0[q], y1[q] + 1))
    got: dict[int, set] = {}
    chunks = model.coverage(e, code, rects)
    full, _, _ = next(chunks)
    for c in full.tolist():
        got[c] = {(x, y) for x in range(n) for y in range(n)}
    for codes, covered, (wx0, wy0) in chunks:
        assert covered.shape[0] == len(codes) == len(wx0) == len(wy0)
        for i, c in enumerate(codes.tolist()):
            j, cy, cx = np.nonzero(covered[i:i + 1])
            got[c] = {(int(x + wx0[i]), int(y + wy0[i])) for x, y in zip(cx, cy)}
    assert got == want
