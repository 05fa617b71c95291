"""Benchmark: the coordinator's CPU per Ray actor call, by what the call carries.

A batch costs the coordinator one actor call per worker. This times the submitting thread's CPU
(``time.thread_time``, as ``route_cpu_ms`` does) of ``--calls`` calls to one idle actor, for
argument shapes the dispatch could use: the shared batch's reference with a row array
(``--rows`` int64), with keyword options, or alone; and the CPU of one ``ray.put`` of a batch
of ``--objects`` tweet-shaped objects (5 keywords each) as the dispatch shares it
(:class:`~knnmon.batch.ObjectBatch`, its table as one Arrow IPC stream), or with the table
pickled column by column as before::

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
    p.add_argument("--objects", type=int, default=1000)
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
        "ref + None + 2 options None": lambda: sink.take.remote(shared, None, cutoff=None, refills=None),
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
    for name, ms in _puts(a.objects, a.calls // 10).items():
        print(f"{name:28s} {ms:.3f} ms CPU per put")
    ray.shutdown()


def _puts(n: int, reps: int) -> dict[str, float]:
    """CPU per ``ray.put`` of one batch of ``n`` objects, by its form (second of two rounds)."""
    import pyarrow as pa

    from knnmon.batch import ObjectBatch

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(5000)]
    table = pa.table({"id": [f"tweet-{i:012d}" for i in range(n)], "lon": rng.uniform(-120, -70, n),
                      "lat": rng.uniform(25, 49, n), "t": np.arange(n, dtype=np.int64),
                      "keywords": [[words[j] for j in rng.integers(0, 5000, 5)] for _ in range(n)]})
    pair_obj = np.repeat(np.arange(n, dtype=np.int64), 5)
    pair_code, masks = rng.integers(0, 10**6, 5 * n), rng.integers(0, 2**12, n).astype(np.uint64)

    forms = {"put ObjectBatch": lambda: ray.put(ObjectBatch(0, table, pair_obj, pair_code, masks)),
             "put table pickled by column": lambda: ray.put((table, pair_obj, pair_code, masks))}
    out = {}
    for _ in range(2):
        for name, put in forms.items():
            c0 = time.thread_time()
            refs = [put() for _ in range(reps)]
            out[name] = (time.thread_time() - c0) / reps * 1e3
            del refs
    return out


if __name__ == "__main__":
    main()
