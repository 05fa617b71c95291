"""Algorithm 1's split choice on a case computed by hand."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from knnmon.assignment.base import QuerySet
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.proposed import ProposedAssigner
from knnmon.assignment.workload import Workload
from knnmon.grid import Grid


@pytest.fixture
def case():
    # 4 x 4 one-degree cells; N = 8. "a": 2 objects in cell 0, 1 in cell 15. "b": 1 in cell 0, 1 in cell 15.
    model = LoadModel(Grid(0.0, 0.0, 4.0, 4.0, 4), ["a", "b"], np.array([0, 2, 4]),
                      np.array([0, 15, 0, 15], dtype=np.int32), np.array([2, 1, 1, 1]), n_objects=8)
    table = pa.table({"id": ["q0", "q1", "q2", "q3"], "lon": [0.5, 3.5, 0.5, 3.5], "lat": [0.5, 3.5, 0.5, 3.5],
                      "keywords": [["a"], ["a"], ["b"], ["b"]], "k": pa.array([1] * 4, type=pa.int32())})
    # q0 has r = inf (covers the grid); the others cover their own cell only.
    wl = Workload.build(model, table, np.array([np.inf, 1000.0, 1000.0, 1000.0]))
    return model, wl


def test_costs_by_hand(case):
    model, wl = case
    # L: q0 = P(all, a) = 3/8; q1 = P(c15, a) = 1/8; q2 = P(c0, b) = 1/8; q3 = P(c15, b) = 1/8.
    assert wl.load.tolist() == pytest.approx([3 / 8, 1 / 8, 1 / 8, 1 / 8])
    algo = ProposedAssigner(beta=100)
    root = QuerySet(np.arange(4), float(wl.load.sum()), [], model.grid_region)
    space, text = algo._space(wl, root), algo._text(wl, root)
    assert sorted(sorted(s.members.tolist()) for s in space) == [[0, 2], [1, 3]]
    assert sorted(sorted(s.members.tolist()) for s in text) == [[0, 1], [2, 3]]
    # Space: SW {q0, q2}: a everywhere 3/8 + b in c0 1/8; NE {q1, q3}: a 1/8 + b 1/8  -> sum D = 6/8.
    # Text:  {q0, q1}: a everywhere 3/8;      {q2, q3}: b in c0 and c15 2/8           -> sum D = 5/8.
    sum_l = 6 / 8
    assert algo._cost(wl, model, space) == pytest.approx(sum_l + 6 / 8)
    assert algo._cost(wl, model, text) == pytest.approx(sum_l + 5 / 8)
    chosen = algo._split(wl, model, root)                           # C_t < C_s: keywords
    assert [c.members.tolist() for c in chosen] == [c.members.tolist() for c in text]
    assert chosen[0].history[-1].startswith("text")
    assert ProposedAssigner(beta=3)._split(wl, model, root)[0].history[-1].startswith("space")  # |Q| > beta
    assert ProposedAssigner(beta=100, delivery_cost=0.0)._split(wl, model, root)[0].history[-1].startswith("text")
