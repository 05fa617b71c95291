"""The statistics grid: edges, clamping, serialisation, invalid input, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from knnmon.errors import InvalidArgumentError
from knnmon.grid import Grid


def test_cells_at_edges_and_outside():
    g = Grid(-10.0, 0.0, 10.0, 20.0, n=4)  # cells 5 deg wide, 5 deg high
    lon = np.array([-10.0, -5.0, -5.000001, 10.0, 11.0, -50.0])
    lat = np.array([0.0, 5.0, 4.999999, 20.0, 30.0, -5.0])
    cx, cy = g.cell_xy(lon, lat)
    assert cx.tolist() == [0, 1, 0, 3, 3, 0]
    assert cy.tolist() == [0, 1, 0, 3, 3, 0]
    assert g.cell_of(lon, lat).tolist() == [0, 5, 0, 15, 15, 0]
    assert g.cell_of(lon, lat).dtype == np.int32


def test_round_trip_and_degenerate_box():
    g = Grid.covering(3.0, 4.0, 3.0, 4.0, 16)
    assert g.max_lon > g.min_lon and g.max_lat > g.min_lat
    assert Grid.from_dict(g.to_dict()) == g
    assert g.to_dict()["cell_id"] == "cy * n + cx"


@pytest.mark.parametrize(
    ("args", "match"),
    [((0, 0, 1, 1, 0), "n must be an integer >= 1"), ((0, 0, float("nan"), 1, 4), "finite"),
     ((1, 0, 0, 1, 4), "must not be below")],
)
def test_invalid(args, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Grid(*args)


@given(
    st.integers(1, 300),
    st.lists(st.tuples(st.floats(-180, 180), st.floats(-90, 90)), min_size=1, max_size=50),
)
def test_every_point_gets_a_cell_that_holds_it(n, pts):
    g = Grid(-125.0, 20.0, -60.0, 50.0, n)
    lon, lat = np.array(pts).T
    cx, cy = g.cell_xy(lon, lat)
    assert ((0 <= cx) & (cx < n) & (0 <= cy) & (cy < n)).all()
    inside = (lon >= g.min_lon) & (lon < g.max_lon) & (lat >= g.min_lat) & (lat < g.max_lat)
    lo_x = g.min_lon + cx * g.cell_width_deg
    lo_y = g.min_lat + cy * g.cell_height_deg
    eps = 1e-9
    assert (lo_x[inside] <= lon[inside] + eps).all() and (lon[inside] < lo_x[inside] + g.cell_width_deg + eps).all()
    assert (lo_y[inside] <= lat[inside] + eps).all() and (lat[inside] < lo_y[inside] + g.cell_height_deg + eps).all()
