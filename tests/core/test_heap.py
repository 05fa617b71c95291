"""The heap helpers: building a large state without the cyclic collector's passes."""

from __future__ import annotations

import gc
import weakref

import pytest

from knnmon.heap import bulk_build, full_gc_passes


class _Node:
    me: object = None


def test_bulk_build_pauses_the_collector_then_frees_cycles_and_freezes_the_rest():
    assert gc.isenabled()
    try:
        with bulk_build():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]
            cycle = _Node()
            cycle.me = cycle
            alive = weakref.ref(cycle)
            del cycle
            assert alive() is not None  # no automatic pass inside
            with bulk_build():  # nested: the outer block owns the collector
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
        assert alive() is None  # the cycle made inside was collected on leaving
        with pytest.raises(RuntimeError), bulk_build():  # an error leaves the collector on
            raise RuntimeError("boom")
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_full_passes_are_counted_and_timed():
    passes = full_gc_passes()
    before = passes.state()
    gc.collect(1)  # not a full pass
    assert passes.state()["count"] == before["count"]
    gc.collect()
    after = passes.state()
    assert after["count"] == before["count"] + 1 and after["total_ms"] >= before["total_ms"]
    assert after["max_ms"] >= 0 and full_gc_passes() is passes
