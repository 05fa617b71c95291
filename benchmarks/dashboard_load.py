"""The dashboard beside a busy service: its endpoints' response times at 100,000 queries, and the
service's throughput with and without a dashboard watching.

One embedded Redis; ``knnmon serve`` (4 Ray workers) with ``--queries-n`` queries registered;
``knnmon dashboard`` in its own process. Measured:

- the first ``/api/queries`` (reads every query from Redis into the snapshot), then repeated ones
  for the whole world and for a city-sized box (p50 / max ms, bytes);
- ``/api/results/<qid>`` and ``/api/status`` (p50 / max ms);
- saturated objects/s of the service for ``--objects-n`` objects published unpaced, first with no
  dashboard client, then with ``--clients`` pages open: each on ``/api/changes`` watching a
  query, and a map view (``/api/queries``) loaded every 5 s; after one warm-up run, in the order
  ABBAAB; with the dashboard process's CPU seconds per second during each run.

    python -m benchmarks.dashboard_load --objects /tmp/full_default --queries /tmp/q100k.parquet \\
        --report /tmp/knnmon-bench/dashboard_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.redis_server import EmbeddedRedis, free_port
from tests.support import object_fields, register_fields, wait_processed


def timed_get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return (time.perf_counter() - t0) * 1e3, len(body)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stats(ms: list[float]) -> dict:
    return {"n": len(ms), "p50_ms": round(float(np.median(ms)), 2), "max_ms": round(float(np.max(ms)), 2)}


def watchers(http: str, qids: list[str], stop: threading.Event) -> list[threading.Thread]:
    """A reader of the live feed per query of ``qids`` (each watching that query, as a page with
    a query selected does), and a view of the map loaded every 5 s."""

    def feed(qid: str) -> None:
        with urllib.request.urlopen(f"{http}/api/changes?qid={qid}", timeout=120) as resp:
            for _ in resp:
                if stop.is_set():
                    return

    def poll() -> None:  # a user panning the map now and then (the page polls nothing else)
        while not stop.wait(5.0):
            timed_get(http + "/api/queries?limit=2000")

    threads = [threading.Thread(target=feed, args=(q,), daemon=True) for q in qids]
    threads.append(threading.Thread(target=poll, daemon=True))
    for t in threads:
        t.start()
    return threads


def saturated(r: redis.Redis, keys: Keys, proc: subprocess.Popen, objs: list[dict]) -> float:
    t0 = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i, o in enumerate(objs):
        pipe.xadd(keys.ingest_objects, object_fields(o))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    wait_processed(r, keys, proc, timeout_s=600)
    return len(objs) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--objects-n", type=int, default=20_000, help="objects per throughput run")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--report")
    a = ap.parse_args(argv)

    objects = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None)
    rest = objects.slice(a.initial)
    rest = rest.take(pa.array(np.random.default_rng(1).permutation(rest.num_rows)[:7 * a.objects_n])).to_pylist()
    queries = pq.read_table(a.queries).slice(0, a.queries_n)
    out: dict = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
                 "command": " ".join(sys.argv), "config": vars(a)}
    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        keys = Keys("bench")
        proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", server.url,
                                 "--namespace", keys.namespace, "--objects", a.objects, "--initial", str(a.initial),
                                 "--workers", str(a.workers)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pipe = r.pipeline(transaction=False)
        for q in queries.to_pylist():
            pipe.xadd(keys.ingest_queries, register_fields(q))
        pipe.execute()
        wait_processed(r, keys, proc, timeout_s=3600)
        port = free_port()
        http = f"http://127.0.0.1:{port}"
        dash = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "dashboard", "--redis", server.url,
                                 "--namespace", keys.namespace, "--http", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    timed_get(http + "/api/config")
                    break
                except OSError:
                    time.sleep(0.2)
            first_ms, first_bytes = timed_get(http + "/api/queries?limit=2000")
            out["first_queries_read"] = {"ms": round(first_ms, 1), "bytes": first_bytes,
                                         "queries": int(r.scard(keys.queries))}
            lon, lat = queries.column("lon").to_numpy(), queries.column("lat").to_numpy()
            c = int(np.argmax(np.histogram2d(lon, lat, bins=64)[0].ravel()))  # the densest city
            cx, cy = np.unravel_index(c, (64, 64))
            edges_x, edges_y = np.histogram2d(lon, lat, bins=64)[1:]
            city = f"{edges_x[cx]},{edges_y[cy]},{edges_x[cx + 1]},{edges_y[cy + 1]}"
            for name, path in (("queries_world", "/api/queries?limit=2000"),
                               ("queries_city", f"/api/queries?bbox={city}&limit=2000"),
                               ("status", "/api/status")):
                got = [timed_get(http + path) for _ in range(a.repeat)]
                out[name] = {**stats([g[0] for g in got]), "bytes": got[-1][1]}
            qids = queries.column("id").to_pylist()[:a.repeat]
            out["results"] = stats([timed_get(f"{http}/api/results/{q}")[0] for q in qids])
            saturated(r, keys, proc, rest[:a.objects_n])  # warm-up, not counted (the first run is slower)
            rates: dict[str, list[float]] = {"no dashboard": [], "dashboard watching": []}
            cpu: dict[str, list[float]] = {"no dashboard": [], "dashboard watching": []}
            for i, watched in enumerate([False, True, True, False, False, True], start=1):
                stop = threading.Event()
                threads = watchers(http, qids[:a.clients], stop) if watched else []
                c0, t0 = cpu_s(dash.pid), time.perf_counter()
                rate = saturated(r, keys, proc, rest[i * a.objects_n:(i + 1) * a.objects_n])
                share = (cpu_s(dash.pid) - c0) / (time.perf_counter() - t0)
                stop.set()
                rates["dashboard watching" if watched else "no dashboard"].append(round(rate, 1))
                cpu["dashboard watching" if watched else "no dashboard"].append(round(share, 3))
                print(f"{'watched' if watched else 'alone'}: {rate:,.0f} objects/s", flush=True)
                for t in threads:
                    t.join(timeout=5)
            out["saturated_objects_per_s"] = rates
            out["dashboard_cpu_s_per_s"] = cpu  # the dashboard process's CPU seconds per second of the run
        finally:
            dash.terminate()
            dash.wait(timeout=30)
            proc.terminate()
            proc.wait(timeout=120)
    print(json.dumps(out, indent=2))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
