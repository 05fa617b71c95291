"""Benchmark: what the window's expiry costs a worker per call, against the coordinator's whole
expiry step (issue 35: in ``serve`` under Ray the expiry round trip took 13 ms per batch).

Runs ``knnmon run`` in this process (``--executor inline``, so a call's time is the worker's own
work, no Ray) with three methods timed: ``WindowLists.expire`` (a worker's expiry),
``KnnWorker.process_batch`` and ``Dispatcher._expire`` (the store's expiry, every worker's, and
the refill search). Prints calls, mean, p50 and p90 ms of each after the first 20 calls::

    python benchmarks/expire_cost.py run --objects /tmp/full --queries /tmp/q110k.parquet --workers 4 \\
        --executor inline --initial 600000 --batch 100 --batches 400 --window 600s --arrival-ms 1 --quiet
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np

import knnmon.coordinator.runtime.dispatch as dispatch
from knnmon.coordinator.cli import main as knnmon_main
from knnmon.workers import window_lists, worker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refill_time import timed  # noqa: E402 - the same wrapper

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def _timed(owner, name: str, key: str) -> None:
    """Time every call of ``owner.name`` into ``TIMES[key]`` (ms)."""
    timed(owner, name, lambda seconds: TIMES[key].append(seconds * 1e3))


def main() -> None:
    _timed(window_lists.WindowLists, "expire", "worker expire")
    _timed(worker.KnnWorker, "process_batch", "worker process_batch")
    _timed(dispatch.Dispatcher, "_expire", "dispatcher _expire (expire + refill)")
    rc = knnmon_main(sys.argv[1:])
    for key, ms in TIMES.items():
        v = np.array(ms[20:])
        if len(v):
            print(f"{key:40s} calls {len(v):6d} mean {v.mean():7.2f} p50 {np.median(v):7.2f} "
                  f"p90 {np.percentile(v, 90):7.2f} ms")
    sys.exit(rc)


if __name__ == "__main__":
    main()
