"""The query index's compiled run merge against a numpy reference: the current entries of both
runs in key order, the dropped ones taken off the level counts, the distinct keys with their
starts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.workers.grid_runs import GridRun, merge_current

CELL_BITS, CODE_BITS, CODES, LEVELS, SLOTS = 4, 3, 8, 3, 12


def _run(rng: np.random.Generator, n: int) -> GridRun:
    level, code, cell = rng.integers(0, LEVELS, n), rng.integers(0, CODES, n), rng.integers(0, 1 << CELL_BITS, n)
    keys = np.sort((level << (CODE_BITS + CELL_BITS)) | (code << CELL_BITS) | cell)
    return GridRun(keys, rng.integers(0, SLOTS, n), rng.integers(0, 3, n).astype(np.int32))


def _levels(keys: np.ndarray) -> np.ndarray:
    out = np.zeros((CODES, LEVELS), np.int32)
    np.add.at(out, ((keys >> CELL_BITS) & (CODES - 1), keys >> (CODE_BITS + CELL_BITS)), 1)
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), na=st.integers(0, 40), nb=st.integers(0, 40))
def test_a_merge_keeps_the_current_entries_in_key_order_and_uncounts_the_rest(seed: int, na: int, nb: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = _run(rng, na), _run(rng, nb)
    gen = rng.integers(0, 3, SLOTS).astype(np.int32)
    keys = np.r_[a.keys, b.keys]
    levels = _levels(keys)
    out = merge_current(a, b, gen, levels, CELL_BITS, CODE_BITS)

    slots, gens = np.r_[a.slots, b.slots], np.r_[a.gens, b.gens]
    current = gens == gen[slots]
    want = sorted(zip(keys[current].tolist(), slots[current].tolist(), gens[current].tolist()))
    assert np.all(np.diff(out.keys) >= 0)
    assert sorted(zip(out.keys.tolist(), out.slots.tolist(), out.gens.tolist())) == want
    assert np.array_equal(levels, _levels(keys[current]))
    ukeys, ustart = out.distinct
    assert np.array_equal(ukeys, np.unique(out.keys))
    assert np.array_equal(out.keys[ustart[:-1]], ukeys) and ustart[-1] == len(out)
    assert np.array_equal(np.diff(ustart), np.unique(out.keys, return_counts=True)[1])
