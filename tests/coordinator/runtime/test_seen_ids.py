"""The dispatcher's ids seen: exactly a set's answers, in runs of hashes, with and without a window."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import knnmon.coordinator.runtime.seen_ids as seen_ids
from knnmon.coordinator.runtime.seen_ids import SeenIds


@settings(max_examples=40, deadline=None)
@given(initial=st.lists(st.text(min_size=1, max_size=6), max_size=60, unique=True),
       batches=st.lists(st.lists(st.text(min_size=1, max_size=6), max_size=30), max_size=12),
       seal=st.sampled_from([1, 3, 16]))
def test_add_new_and_contains_equal_a_set(initial, batches, seal):
    seen_ids.SEAL = seal  # runs seal and merge often
    try:
        s, want = SeenIds(pa.array(initial, type=pa.string())), set(initial)
        for batch in batches:
            expect, taken = [], set()
            for oid in batch:
                expect.append(oid not in want and oid not in taken)
                taken.add(oid)
            before = len(s)
            assert (~s.seen_v(batch)).tolist() == expect and len(s) == before  # asking changes nothing
            if len(want) % 2:  # admitted already (knnmon serve): only the new ones added, unchecked
                s.add([oid for oid, new in zip(batch, expect) if new])
            else:
                assert s.add_new(batch).tolist() == expect
            want |= taken
            assert len(s) == len(want)
        for oid in set(initial) | {b for bs in batches for b in bs} | {"never-seen"}:
            assert (oid in s) == (oid in want)
    finally:
        seen_ids.SEAL = 65_536


def test_colliding_hashes_are_told_apart_by_the_ids(monkeypatch):
    monkeypatch.setattr(seen_ids, "_hashes", lambda ids: np.zeros(len(ids), dtype=np.uint64))
    s = SeenIds(["a", "b"])
    assert s.add_new(["c", "a", "c", "d"]).tolist() == [True, False, False, True]
    assert "b" in s and "c" in s and "e" not in s


def test_a_window_forgets_runs_whose_objects_all_expired(monkeypatch):
    monkeypatch.setattr(seen_ids, "WINDOW_RUN", 100)
    monkeypatch.setattr(seen_ids, "SEAL", 50)
    ids = [f"o{i}" for i in range(1000)]
    s = SeenIds(ids, np.arange(1000), windowed=True)
    s.add_new([f"n{i}" for i in range(120)], np.arange(1000, 1120))
    assert len(s) == 1120
    s.forget(499)  # runs of t 0-99 .. 400-499 go
    assert len(s) == 620 and "o499" not in s and "o500" in s and "n0" in s
    assert s.add_new(["o10", "o600"]).tolist() == [True, False]  # a forgotten id counts as new
    s.forget(10_000)
    assert len(s) == 0
