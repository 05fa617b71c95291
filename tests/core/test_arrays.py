"""``knnmon.arrays``: ``with_capacity`` keeps the rows, pads with zeros, doubles; ``run_starts`` agrees with
searching the sorted array in itself; ``members`` is ``np.isin``; ``segment_sums`` sums each run."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from knnmon.arrays import members, run_starts, segment_sums, with_capacity


@given(st.integers(0, 20), st.integers(0, 50), st.sampled_from([(), (3,)]))
def test_with_capacity(m, n, tail):
    a = np.arange(m * int(np.prod(tail, dtype=int)), dtype=np.int32).reshape(m, *tail) + 1
    b = with_capacity(a, n)
    if n <= m:
        assert b is a
    else:
        assert b.shape == (max(n, 2 * m), *tail) and b.dtype == a.dtype
        assert np.array_equal(b[:m], a) and not b[m:].any()


@given(st.lists(st.integers(-3, 12), max_size=60))
def test_run_starts_is_searchsorted_of_the_array_in_itself(values):
    a = np.sort(np.array(values, dtype=np.int64))
    start, length = run_starts(a)
    assert start.dtype == length.dtype == np.int64
    assert np.array_equal(start, np.searchsorted(a, a, side="left"))
    assert np.array_equal(start + length, np.searchsorted(a, a, side="right"))


@given(st.lists(st.integers(-2**62, 2**62) | st.integers(0, 9), max_size=40),
       st.lists(st.integers(-2**62, 2**62) | st.integers(0, 9), max_size=40))
def test_members_is_isin(a, b):
    a, b = np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)
    got = members(a, b)
    assert got.dtype == bool and np.array_equal(got, np.isin(a, b))


@given(st.lists(st.lists(st.integers(-5, 5), max_size=6), max_size=12))
def test_segment_sums_sum_each_run(segments):
    lengths = np.array([len(x) for x in segments], dtype=np.int64)
    values = np.array([v for x in segments for v in x], dtype=np.int64)
    assert segment_sums(values, lengths).tolist() == [sum(x) for x in segments]
    assert segment_sums(values > 0, lengths).tolist() == [sum(v > 0 for v in x) for x in segments]
