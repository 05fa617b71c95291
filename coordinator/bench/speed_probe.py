"""A fixed, memory-bound workload timed before and after each benchmark run.

The figures of a benchmark are only comparable between runs if the machine ran at the same
speed. The shared 2-core VM knnmon is measured on does not (docs/performance.md, "How the figures were taken":
the same worker benchmark ran 2.5x slower a few hours later), and what slows down is the work
the runtime does: random look-ups in large hash tables and sorted arrays. This probe does that work (Python dict look-ups and
``numpy.searchsorted`` over arrays far larger than the CPU caches), so a report can show whether
its rows were measured on a machine running at one speed.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

__all__ = ["speed_probe_ms"]


@lru_cache(maxsize=1)
def _data() -> tuple[dict[int, int], list[int], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    table = dict.fromkeys(range(1_000_000), 0)  # ~100 MB with its keys
    lookups = rng.integers(0, 1_000_000, 100_000).tolist()
    keys = np.sort(rng.integers(0, 2**40, 5_000_000))  # 40 MB
    probes = rng.integers(0, 2**40, 100_000)
    return table, lookups, keys, probes


def speed_probe_ms(repeat: int = 2) -> float:
    """Milliseconds of the probe workload (the fastest of ``repeat`` rounds).

    One round is 100,000 random look-ups in a 1,000,000-key ``dict`` and 100,000
    ``numpy.searchsorted`` probes into a sorted ``(5_000_000,)`` int64 array. On a machine with
    a steady speed, rounds agree within a few percent; a larger value later in a report means the
    machine was slower then (the first call also builds the data, about 0.5 s, untimed).
    """
    table, lookups, keys, probes = _data()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        get = table.__getitem__
        for x in lookups:
            get(x)
        np.searchsorted(keys, probes)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3
