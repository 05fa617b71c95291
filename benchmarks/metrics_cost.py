"""What the Prometheus metrics cost the service (docs/serve.md, "Monitoring"): one minibatch's
observation (:meth:`KnnMetrics.observe_batch` with its objects' response times) on the service
loop, and one scrape's exposition of a service with ``--workers`` workers (without the scrape's
Redis reads of the stream lag), in the HTTP server's thread.

    python benchmarks/metrics_cost.py --objects 1000 --workers 12
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from prometheus_client import generate_latest

from knnmon.coordinator.runtime.prometheus import KnnMetrics, Readings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=1000, help="objects per minibatch")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--repeat", type=int, default=2000)
    a = p.parse_args()
    w = a.workers
    readings = Readings(counters={"objects": 10**9, "batches": 10**6, "registered": 10**6},
                        rejected={("objects", "bad_id"): 5, ("queries", "bad_k"): 2}, lag={"objects": 0, "queries": 0},
                        worker_queries=[1000] * w, worker_busy_ratio=[0.5] * w, worker_rss_bytes=[3e8] * w,
                        live_objects=10**6, watermark_s=1.7e9)
    metrics = KnnMetrics(lambda: readings)
    response_ms = np.random.default_rng(0).uniform(1, 100, a.objects)
    t = time.perf_counter()
    for _ in range(a.repeat):
        metrics.observe_batch(12.0, 3.0, response_ms)
    observe_us = (time.perf_counter() - t) / a.repeat * 1e6
    t = time.perf_counter()
    for _ in range(a.repeat // 10):
        text = generate_latest(metrics.registry)
    scrape_ms = (time.perf_counter() - t) / (a.repeat // 10) * 1e3
    print(f"observe_batch, {a.objects:,} objects: {observe_us:.1f} us; scrape of {w} workers: {scrape_ms:.2f} ms, "
          f"{len(text):,} bytes")


if __name__ == "__main__":
    main()
