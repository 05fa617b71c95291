"""The routing table's compiled lookup (``routing_lookup``): every pair's workers are the OR of
its keyword's ``always`` mask, its (keyword, cell) entry and its keyword's rectangles holding the
cell, checked against a brute force over random tables, with and without numba's JIT."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.assignment.routing import RoutingTable
from knnmon.assignment.routing_lookup import CodeStarts, or_entries, route_pairs
from knnmon.assignment.routing_regions import KeywordRegions
from knnmon.grid import Grid

N = 4  # cells per side
K = 6  # keyword codes known when the starts were computed

entry = st.tuples(st.integers(0, K - 1), st.integers(0, N * N - 1), st.integers(1, 2**64 - 1))
rect = st.tuples(st.integers(0, K - 1), st.integers(0, N - 1), st.integers(0, N - 1), st.integers(0, N - 1),
                 st.integers(0, N - 1), st.integers(1, 2**64 - 1))


def _brute(cells, owner, codes, always, entries, rects) -> np.ndarray:
    out = np.zeros(len(cells), dtype=np.uint64)
    for o, c in zip(owner.tolist(), codes.tolist()):
        if c < 0:
            continue
        cell = int(cells[o])
        x, y = cell % N, cell // N
        out[o] |= always[c]
        for k, m in entries.items():
            if k == c * N * N + cell:
                out[o] |= np.uint64(m)
        for rc, x0, y0, x1, y1, m in rects:
            if rc == c and x0 <= x <= x1 and y0 <= y <= y1:
                out[o] |= np.uint64(m)
    return out


@settings(max_examples=80, deadline=None)
@given(entries=st.lists(entry, max_size=30), delta=st.lists(entry, max_size=10), rects=st.lists(rect, max_size=12),
       always=st.lists(st.integers(0, 2**64 - 1), min_size=K + 2, max_size=K + 2),
       objects=st.lists(st.integers(0, N * N - 1), min_size=1, max_size=8),
       pairs=st.lists(st.tuples(st.integers(0, 7), st.integers(-1, K + 1)), max_size=40))
def test_a_pair_gets_its_keywords_always_mask_entry_and_rectangles(entries, delta, rects, always, objects, pairs):
    """Codes ``K`` and ``K + 1`` came after the starts were computed (a keyword registered since
    the last fold): only ``always`` and the small delta route them."""
    table = {c * N * N + cell: m for c, cell, m in entries}
    keys = np.array(sorted(table), dtype=np.int64)
    masks = np.array([table[k] for k in keys.tolist()], dtype=np.uint64)
    rects = sorted(r for r in rects if r[1] <= r[3] and r[2] <= r[4])
    regions = KeywordRegions(*(np.array([r[j] for r in rects], dtype=np.int64 if j == 0 else np.int32)
                               for j in range(5)), np.array([r[5] for r in rects], dtype=np.uint64))
    small = {c * N * N + cell: m for c, cell, m in delta}
    small.update({(K + 1) * N * N + cell: m for _, cell, m in delta[:2]})
    dkeys = np.array(sorted(small), dtype=np.int64)
    dmasks = np.array([small[k] for k in dkeys.tolist()], dtype=np.uint64)
    always = np.array(always, dtype=np.uint64)
    cells = np.array(objects, dtype=np.int64)
    owner = np.array([o % len(objects) for o, _ in pairs], dtype=np.int64)
    codes = np.array([c for _, c in pairs], dtype=np.int64)

    out = np.zeros(len(cells), dtype=np.uint64)
    starts = CodeStarts().of(keys, regions.code, N * N, K)
    route_pairs(out, cells, owner, codes, always, N, keys, masks, starts, regions)
    or_entries(out, cells, owner, codes, N * N, dkeys, dmasks)

    merged = dict(small)
    for k, m in table.items():
        merged[k] = merged.get(k, 0) | m
    assert np.array_equal(out, _brute(cells, owner, codes, always, merged, rects))


def test_starts_follow_the_table_when_its_arrays_are_replaced():
    """A fold of the delta gives the table new ``keys``: the starts are recomputed, and a keyword
    registered after the first starts routes through them once folded."""
    grid = Grid(0.0, 0.0, 4.0, 4.0, n=N)
    from knnmon.coordinator.live_routing import LiveRouting

    table = LiveRouting(RoutingTable(grid, ["a", "b"], np.zeros(2, dtype=np.uint64),
                                     np.array([N * N + 3], dtype=np.int64), np.array([2], dtype=np.uint64)))
    route = lambda codes, cell: table.route_v(np.array([cell]), np.zeros(len(codes), dtype=np.int64),  # noqa: E731
                                              np.array(codes, dtype=np.int64))[0]
    assert route([1], 3) == 2 and route([0], 3) == 0
    counts, codes = table.codes_of(pa.array([["c"]], type=pa.list_(pa.string())))
    assert codes.tolist() == [2] and table.table.vocabulary[2] == "c"
    table.add_many((counts, codes), [3], [0], [3], [0], [5])  # cell 3, worker 5: in the delta
    assert route([2], 3) == 1 << 5
    t = table.table
    t.keys, t.masks = np.array([N * N + 3, 2 * N * N + 3], dtype=np.int64), np.array([2, 1 << 5], np.uint64)
    table.delta_keys, table.delta_masks = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
    assert route([2], 3) == 1 << 5 and route([1, 2], 3) == 2 | 1 << 5 and route([2], 2) == 0


def test_the_lookup_is_the_same_without_the_jit():
    """The kernels as plain Python (``NUMBA_DISABLE_JIT=1``) pass the brute-force test too."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "always_mask_entry or starts_follow"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
