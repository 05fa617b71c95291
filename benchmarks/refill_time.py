"""Benchmark: where a windowed run's refill search goes (the coordinator's ``Dispatcher._refill``).

Runs ``knnmon run`` in this process with the refill's steps timed (wrapped, only while a refill
runs): the object store's search, the per-keyword k-d tree builds and searches, the tail index.
(The details read it once timed is gone from the store.) Figures quoted in docs/runtime.md:

    python benchmarks/refill_time.py run --objects /tmp/full --queries /tmp/q100k.parquet \\
        --initial 1000000 --batch 1000 --batches 20 --workers 1 --executor inline --shuffle 1 \\
        --window 500s --reserve 8 --arrival-ms 1 --quiet
"""

from __future__ import annotations

import collections
import sys
import time

import knnmon.coordinator.runtime.dispatch as dispatch
import knnmon.coordinator.runtime.object_index as object_index
import knnmon.coordinator.runtime.object_store as object_store
from knnmon.coordinator.cli import main as knnmon_main

SECONDS: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()
_IN_REFILL = [False]


def timed(owner, name: str, record) -> None:
    """Replace ``owner.name`` with a wrapper that hands ``record`` each call's seconds."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            record(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def _timed(owner, name: str, key: str) -> None:
    """Replace ``owner.name`` with a wrapper adding its time under ``key`` while a refill runs."""
    def record(seconds: float) -> None:
        if _IN_REFILL[0]:
            SECONDS[key] += seconds
            CALLS[key] += 1

    timed(owner, name, record)


def main() -> None:
    refill = dispatch.Dispatcher._refill

    def timed_refill(self, needs, *args, **kwargs):
        _IN_REFILL[0] = True
        t0 = time.perf_counter()
        try:
            return refill(self, needs, *args, **kwargs)
        finally:
            _IN_REFILL[0] = False
            SECONDS["refill"] += time.perf_counter() - t0
            CALLS["refill"] += 1
            CALLS["queries refilled"] += sum(len(n.ids) for n in needs)

    dispatch.Dispatcher._refill = timed_refill
    _timed(object_index.ObjectIndex, "knn_v", "ObjectIndex.knn_v")
    _timed(object_store.ObjectStore, "_tail_index", "tail index")
    _timed(object_index, "kd_build", "k-d tree builds")
    _timed(object_index, "kd_knn", "k-d tree searches")
    rc = knnmon_main(sys.argv[1:])
    for key in sorted(SECONDS, key=SECONDS.get, reverse=True):
        print(f"{key:20s} {SECONDS[key] * 1e3:9.1f} ms  calls {CALLS[key]}")
    print(f"queries refilled {CALLS['queries refilled']}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
