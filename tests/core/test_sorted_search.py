"""``knnmon.sorted_search``: the same answers as ``numpy.searchsorted`` for probes in any order."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from knnmon.sorted_search import searchsorted_batch

ints = st.lists(st.integers(-50, 50), max_size=60)


@given(ints, ints)
def test_matches_numpy(keys, probes):
    keys, probes = np.sort(np.array(keys, dtype=np.int64)), np.array(probes, dtype=np.int64)
    for side in ("left", "right"):
        assert np.array_equal(searchsorted_batch(keys, probes, side), np.searchsorted(keys, probes, side=side))
