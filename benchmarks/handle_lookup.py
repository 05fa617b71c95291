"""Benchmark: a worker's bulk handle lookup (``ObjectHandles.handles_of``) for a batch's ids.

400,000 handles held; each of 60 calls asks for 1,000 ids, 400 of them new. Figures quoted in
docs/runtime.md (run once per tree, e.g. with ``PYTHONPATH`` set to another checkout's overlay,
``benchmarks/ab_run.py``'s ``overlay``):

    python benchmarks/handle_lookup.py
"""

from __future__ import annotations

import time

import numpy as np

from knnmon.workers.object_handles import ObjectHandles


def main() -> None:
    handles, n0 = ObjectHandles(), 400_000
    ids = [f"SG_{i:020d}_place@{i % 977}" for i in range(n0)]
    handles.handles_of(ids, np.zeros(n0, np.int64))
    handles.compact(np.arange(len(handles)))  # (the sealed state a long run is in)
    seconds = []
    for b in range(60):
        batch = [f"SG_{n0 + b * 1000 + i:020d}_new" for i in range(400)] + ids[b * 600:(b + 1) * 600]
        t0 = time.perf_counter()
        handles.handles_of(batch, np.zeros(len(batch), np.int64))
        seconds.append(time.perf_counter() - t0)
    print(f"handles_of, 1,000 ids (400 new), {n0:,} handles held: median {np.median(seconds) * 1e3:.2f} ms, "
          f"mean {np.mean(seconds) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
