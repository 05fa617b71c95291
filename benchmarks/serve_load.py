"""Load generator for ``knnmon serve``: throughput and XADD-to-result latency, bounded in count and time.

It starts an embedded Redis and ``knnmon serve --objects DIR --initial N`` (the first N objects in
stream order are preloaded, as the paper's 1,000,000 initial objects), registers the queries of
a query file through ``knn:ingest:queries``, then publishes the next ``--objects-n`` objects
through ``knn:ingest:objects``, as fast as it can or at ``--rate`` objects/s, for at most
``--duration-s`` seconds. Every object's latency is from its XADD (the entry id's time, set by
Redis) to the acknowledgement of the batch that wrote its effect (``knn:serve:batches``).
``--check Q`` compares Q queries' results with the brute-force oracle afterwards.

    python -m benchmarks.serve_load --objects /tmp/full_default --queries /tmp/q10k.parquet \\
        --initial 1000000 --objects-n 100000 --workers 4 --report /tmp/knnmon-bench/serve.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.ingest.reading import read_objects, stream_order
from knnmon.coordinator.service import latency
from knnmon.protocol import entry_order, entry_time_ms
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.redis_server import EmbeddedRedis
from tests.support import assert_exact, object_fields, register_fields, wait_processed


def publish(r: redis.Redis, key: str, rows: list[dict], rate: float | None, duration_s: float
            ) -> tuple[int, float]:
    """XADD ``rows`` in pipelines paced to ``rate`` objects/s (one pipeline per 10 ms of the
    rate; 200 objects each when unpaced); returns (sent, seconds)."""
    chunk = max(1, min(200, int(rate / 100))) if rate else 200
    t0 = time.perf_counter()
    sent = 0
    for s in range(0, len(rows), chunk):
        if time.perf_counter() - t0 > duration_s:
            break
        if rate:
            ahead = s / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        pipe = r.pipeline(transaction=False)
        for o in rows[s:s + chunk]:
            pipe.xadd(key, object_fields(o))
        pipe.execute()
        sent += len(rows[s:s + chunk])
    return sent, time.perf_counter() - t0


def latencies(r: redis.Redis, keys: Keys, first_id: str) -> tuple[np.ndarray, float, float, int]:
    """Per-object latency (ms) of every object entry from ``first_id`` on, the time span
    (first XADD, last acknowledgement) in epoch ms, and the number of batches."""
    batches = [f for _, f in r.xrange(keys.serve_batches)]
    lat, first_ms, last_ms, n = [], None, 0.0, 0
    start = entry_order(first_id)
    for b in batches:
        if entry_order(b["last"]) < start:
            continue
        done = float(b["done_ms"])
        ms = np.array([entry_time_ms(b["first"])], dtype=np.float64)
        if "lat_hist" in b:  # each object's time, whichever entries the (mini)batch held
            lat.append(np.repeat(latency.midpoints(), latency.decode([b["lat_hist"]])))
        else:  # records written before lat_hist: the batch was a run of the stream
            ids = [e for e, _ in r.xrange(keys.ingest_objects, min=b["first"], max=b["last"])]
            ms = np.array([entry_time_ms(e) for e in ids], dtype=np.float64)
            lat.append(done - ms)
        first_ms = ms.min() if first_ms is None else min(first_ms, ms.min())
        last_ms = max(last_ms, done)
        n += 1
    return np.concatenate(lat) if lat else np.zeros(0), first_ms or 0.0, last_ms, n


def processes(proc: subprocess.Popen, server: EmbeddedRedis, status: dict) -> dict[str, list[psutil.Process]]:
    """The processes whose CPU time an object costs, by role: the coordinator (the service's
    process), its workers (their actor processes), the rest of its process tree (Ray's own
    processes), the Redis server, and this publisher."""
    worker_pids = {w["pid"] for w in status.get("worker_processes") or [] if w.get("pid")}
    tree = psutil.Process(proc.pid).children(recursive=True)
    return {"coordinator": [psutil.Process(proc.pid)], "workers": [psutil.Process(p) for p in worker_pids],
            "ray (other)": [p for p in tree if p.pid not in worker_pids],
            "redis": [psutil.Process(server.proc.pid)], "publisher": [psutil.Process()]}


def cpu_s(groups: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """User + system CPU seconds so far per role (a process gone since counts 0)."""
    out = {}
    for role, procs in groups.items():
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        out[role] = total
    return out


def start_serve(url: str, a: argparse.Namespace, r: redis.Redis, keys: Keys, *extra: str) -> subprocess.Popen:
    """``knnmon serve`` in a child process (``extra``: more flags); returns once it has
    published its status."""
    r.delete(keys.serve_status)
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", url,
                             "--namespace", "load", "--objects", a.objects, "--workers", str(a.workers),
                             "--set", f"serve.initial={a.initial}", "--set", f"serve.batch={a.batch}",
                             "--set", f"serve.max_delay_ms={a.max_delay_ms}", "--set", f"serve.batching={a.batching}",
                             *extra])
    while not r.exists(keys.serve_status):
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        time.sleep(0.2)
    return proc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True, help="an ingest output directory")
    ap.add_argument("--queries", required=True, help="a query file (the first --queries-n are registered)")
    ap.add_argument("--queries-n", type=int, default=10_000)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--objects-n", type=int, default=100_000, help="objects to publish (bound in count)")
    ap.add_argument("--duration-s", type=float, default=600.0, help="stop publishing after this long (bound in time)")
    ap.add_argument("--rate", type=float, help="objects/s to publish at (default: as fast as possible)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--max-delay-ms", type=float, default=20.0, help="with --batching fixed")
    ap.add_argument("--batching", default="adaptive", help="the service's --batching (fixed: the first policy)")
    ap.add_argument("--replan", action="store_true",
                    help="restart the service after the registrations, so that it plans them with its algorithm")
    ap.add_argument("--check", type=int, default=0, help="queries to check against the brute-force oracle")
    ap.add_argument("--report", help="write the measurements as JSON")
    a = ap.parse_args(argv)

    objects = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None)
    stream = objects.slice(a.initial, a.objects_n).to_pylist()
    queries = pq.read_table(a.queries).slice(0, a.queries_n)
    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        keys = Keys("load")
        t0 = time.perf_counter()
        proc = start_serve(server.url, a, r, keys)
        try:
            start_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            pipe = r.pipeline(transaction=False)
            for q in queries.to_pylist():
                pipe.xadd(keys.ingest_queries, register_fields(q))
            pipe.execute()
            wait_processed(r, keys, proc, timeout_s=3600)
            register_s = time.perf_counter() - t1
            print(f"serve up in {start_s:.1f} s; {queries.num_rows:,} queries registered through the stream in "
                  f"{register_s:.1f} s", flush=True)
            restart_s = None
            if a.replan:
                proc.terminate()
                proc.wait(timeout=300)
                t2 = time.perf_counter()
                proc = start_serve(server.url, a, r, keys, "--set", "serve.replan=true")
                restart_s = time.perf_counter() - t2
                print(f"restarted (recovery and plan of {queries.num_rows:,} queries) in {restart_s:.1f} s", flush=True)
            time.sleep(1.2)  # the status names the worker processes (published every second)
            groups = processes(proc, server, json.loads(r.get(keys.serve_status)))
            cpu0 = cpu_s(groups)
            first = r.xadd(keys.ingest_objects, object_fields(stream[0]))
            sent, publish_s = publish(r, keys.ingest_objects, stream[1:], a.rate, a.duration_s)
            wait_processed(r, keys, proc, timeout_s=3600)
            cpu1 = cpu_s(groups)
            lat, first_ms, last_ms, batches = latencies(r, keys, first)
            time.sleep(1.2)  # the service publishes its status every second
            status = json.loads(r.get(keys.serve_status))
            exact = None
            if a.check:
                seen = pa.concat_tables([objects.slice(0, a.initial), objects.slice(a.initial, sent + 1)])
                exact = assert_exact(server.url, "load", queries.slice(0, a.check), BruteForceKnn(seen)) == a.check
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    n = sent + 1
    row = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count()},
        "config": vars(a), "serve_start_s": round(start_s, 2), "register_s": round(register_s, 2),
        "registrations_per_s": queries.num_rows / register_s if register_s else None,
        "restart_s": restart_s, "placement": "planned at restart" if a.replan else "registration-time",
        "objects_published": n, "publish_s": round(publish_s, 2), "offered_objects_per_s": n / publish_s,
        "objects_per_s": n / ((last_ms - first_ms) / 1000) if last_ms > first_ms else None,
        "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p99": float(np.percentile(lat, 99)),
        "latency_ms_max": float(lat.max()), "batches": batches, "objects_per_batch": n / max(batches, 1),
        "busy_ms_per_worker": status["busy_ms_per_worker"], "queries_per_worker": status["queries_per_worker"],
        "exact": exact,
        "cpu_us_per_object": {role: (cpu1[role] - cpu0[role]) / (sent + 1) * 1e6 for role in cpu0},
    }
    row["cpu_us_per_object"]["all"] = sum(row["cpu_us_per_object"].values())
    print(json.dumps(row, indent=2))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(row, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
