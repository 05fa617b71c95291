"""Benchmark: the coordinator's CPU per Ray actor call, by what the call carries.

A batch costs the coordinator one actor call per worker. This times the submitting thread's CPU
(``time.thread_time``, as ``route_cpu_ms`` does) of ``--calls`` calls to one idle actor, for
argument shapes the dispatch could use: the shared batch's reference with a row array
(``--rows`` int64), with keyword options, or alone::

    python benchmarks/ray_call_cost.py --calls 2000 --rows 250
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray


@ray.remote(num_cpus=0)
class _Sink:
    def take(self, *args, **kwargs) -> int:
        return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rows", type=int, default=250)
    a = p.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    sink = _Sink.remote()
    ray.get(sink.take.remote())
    shared = ray.put(np.zeros(100_000))
    rows = np.arange(a.rows, dtype=np.int64)
    shapes = {
        "ref + rows + 2 options": lambda: sink.take.remote(shared, rows, cutoff=None, refills=None),
        "ref + rows": lambda: sink.take.remote(shared, rows),
        "ref + rows as bytes": lambda: sink.take.remote(shared, rows.tobytes()),
        "ref + int": lambda: sink.take.remote(shared, 3),
        "ref": lambda: sink.take.remote(shared),
    }
    for _ in range(2):  # the second round is the one reported
        out = {}
        for name, call in shapes.items():
            refs = []
            c0 = time.thread_time()
            for _ in range(a.calls):
                refs.append(call())
            out[name] = (time.thread_time() - c0) / a.calls * 1e3
            ray.get(refs)
    for name, ms in out.items():
        print(f"{name:28s} {ms:.3f} ms CPU per call")
    ray.shutdown()


if __name__ == "__main__":
    main()
