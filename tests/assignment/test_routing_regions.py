"""The routing table's keyword regions (``KeywordRegions``): rectangles per (keyword, worker,
tile) that hold every query region given, and route exactly the objects inside them (through
the routing table's lookup, ``routing_lookup.route_pairs``)."""

from __future__ import annotations

import numpy as np

from knnmon.assignment.routing_lookup import CodeStarts, route_pairs
from knnmon.assignment.routing_regions import KeywordRegions


def _routed(regions: KeywordRegions, n: int, o_code, o_x, o_y) -> np.ndarray:
    """Per (object, keyword) pair, one object each: the workers of the rectangles holding it,
    from the lookup with no ``always`` mask and no cell entries."""
    code = np.asarray(o_code, dtype=np.int64)
    cells = np.asarray(o_y, dtype=np.int64) * n + np.asarray(o_x, dtype=np.int64)
    k = int(max(code.max(initial=0), regions.code.max(initial=0))) + 1
    keys, out = np.empty(0, dtype=np.int64), np.zeros(len(code), dtype=np.uint64)
    route_pairs(out, cells, np.arange(len(code), dtype=np.int64), code, np.zeros(k, dtype=np.uint64), n, keys,
                np.empty(0, dtype=np.uint64), CodeStarts().of(keys, regions.code, n * n, k), regions)
    return out


def _brute(code, worker, x0, y0, x1, y1, o_code, o_x, o_y) -> np.ndarray:
    """Per (object, keyword) pair: the workers of the query regions holding it."""
    out = np.zeros(len(o_code), dtype=np.uint64)
    for i in range(len(o_code)):
        hit = (code == o_code[i]) & (x0 <= o_x[i]) & (o_x[i] <= x1) & (y0 <= o_y[i]) & (o_y[i] <= y1)
        for w in np.unique(worker[hit]):
            out[i] |= np.uint64(1) << np.uint64(w)
    return out


def test_rectangles_hold_every_region_and_route_a_superset():
    rng = np.random.default_rng(4)
    n, p = 64, 400
    code, worker = rng.integers(0, 6, p), rng.integers(0, 5, p)
    x0, y0 = rng.integers(0, n, p), rng.integers(0, n, p)
    x1, y1 = np.minimum(x0 + rng.integers(0, 12, p), n - 1), np.minimum(y0 + rng.integers(0, 12, p), n - 1)
    regions = KeywordRegions.of_queries(code, worker, x0, y0, x1, y1, n, tiles=4)
    assert len(regions) <= 6 * 5 * 16 and (np.diff(regions.code) >= 0).all()
    o_code, o_x, o_y = rng.integers(0, 7, 5000), rng.integers(0, n, 5000), rng.integers(0, n, 5000)
    out = _routed(regions, n, o_code, o_x, o_y)
    need = _brute(code, worker, x0, y0, x1, y1, o_code, o_x, o_y)
    assert ((need & ~out) == 0).all()  # complete
    assert (out[o_code == 6] == 0).all()  # a keyword without regions goes nowhere
    # tighter than one rectangle per (keyword, worker), which is itself tighter than everywhere
    one = KeywordRegions.of_queries(code, worker, x0, y0, x1, y1, n, tiles=1)
    wide = _routed(one, n, o_code, o_x, o_y)
    assert ((out & ~wide) == 0).all() and _bits(out) < _bits(wide)


def _bits(m: np.ndarray) -> int:
    return int(np.unpackbits(m.view(np.uint8)).sum())


def test_withdraw_and_recode():
    regions = KeywordRegions.of_queries(np.array([3, 3, 5]), np.array([0, 1, 1]), np.array([0, 0, 2]),
                                        np.array([0, 0, 2]), np.array([4, 4, 3]), np.array([4, 4, 3]), 8, tiles=1)
    assert _routed(regions, 8, [3, 5], [1, 2], [1, 2]).tolist() == [0b11, 0b10]
    regions.withdraw(np.array([3]), np.uint64(0b10))
    assert _routed(regions, 8, [3, 5], [1, 2], [1, 2]).tolist() == [0b01, 0b10]
    moved = regions.recoded(np.array([-1, -1, -1, 7, -1, 2]))
    assert sorted(moved.code.tolist()) == [2, 7, 7] and moved.arrays()["region_code"].tolist() == [2, 7, 7]
    assert len(regions.recoded(np.full(6, -1))) == 0
