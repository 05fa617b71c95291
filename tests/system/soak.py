"""Soak: ``knnmon serve --window`` left running under a steady stream, bounded in time and count.

Issue 17's soak (loopback only): an embedded Redis, ``knnmon serve --window 2m`` with 100 k
queries (all places, 1 M preloaded: with arrival times the preload expires with the first batch),
objects published at ``--rate`` (2,000/s) for ``--duration-s`` (20 minutes) without ``t`` (they
take their entry's time). Every ``--sample-s`` (10 s) it samples Redis ``used_memory``, the RSS of
the service and of each worker, the live objects and routing entries (the service's status) and
the latency XADD -> acknowledged of the batches since the last sample (p50 / p99, ms). At each
``--kill-at-s`` it SIGKILLs the service, starts it again and times the restart until it has
caught up (acknowledged every entry published before the kill; ``None`` if it did not within
``--catch-up-s`` after publishing ends). At the end ``--check`` queries
are compared with the brute-force oracle over the live objects the service accepted (a place with
more than ``--max-keywords`` keywords is rejected, as any client's would be). Places are published again under
new ids (``<id>#<round>``) once the stream runs out.

    python -m tests.system.soak --objects /tmp/full --queries /tmp/q100k.parquet \\
        --out /tmp/knnmon-bench/soak.json --plot /tmp/knnmon-bench/soak.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.protocol import entry_order, entry_time_ms, group_info
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.redis_server import EmbeddedRedis
from tests.support import assert_exact, register_fields, wait_processed
from knnmon.window import parse_duration

NAMESPACE = "soak"


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of a process (MB), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, TypeError, ValueError):
        return None
    return None


def start_serve(url: str, a: argparse.Namespace, r: redis.Redis, keys: Keys, log) -> subprocess.Popen:
    """``knnmon serve --window`` in a child process; returns once it published its status."""
    r.delete(keys.serve_status)
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", url,
                             "--namespace", NAMESPACE, "--objects", a.objects, "--set",
                                 f"serve.initial={str(a.initial)}",
                             "--workers", str(a.workers), "--window", a.window, "--set",
                             f"serve.checkpoint_interval_s={str(a.checkpoint_interval)}"], stdout=log,
                                                            stderr=subprocess.STDOUT)
    while not r.exists(keys.serve_status):
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        time.sleep(0.1)
    return proc


class Publisher(threading.Thread):
    """XADDs objects without ``t`` at ``rate``/s until ``stop`` (places again under new ids)."""

    def __init__(self, url: str, key: str, rows: list[dict], rate: float, deadline: float, keep: int) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.key, self.rows, self.rate, self.deadline = key, rows, rate, deadline
        self.sent, self.stop = 0, threading.Event()
        self.published: deque[tuple[str, dict]] = deque(maxlen=keep)  # (entry id, object), the newest

    def run(self) -> None:
        chunk = max(1, int(self.rate / 100))
        t0 = time.monotonic()
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            ahead = self.sent / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
            pipe = self.r.pipeline(transaction=False)
            batch = []
            for i in range(self.sent, self.sent + chunk):
                o = self.rows[i % len(self.rows)]
                o = {**o, "id": f"{o['id']}#{i // len(self.rows)}"}
                batch.append(o)
                pipe.xadd(self.key, {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]),
                                     "keywords": " ".join(o["keywords"])})
            for eid, o in zip(pipe.execute(), batch):
                self.published.append((eid, o))
            self.sent += chunk


#: Per-batch costs summed over a sample (from ``knn:serve:batches``).
BATCH_SUMS = ("objects", "deliveries", "candidates", "changed", "refilled")


def batch_latencies(r: redis.Redis, keys: Keys, since: str) -> tuple[np.ndarray, str, dict[str, float]]:
    """XADD -> acknowledged (ms) of the first entry of each batch logged after ``since`` (the
    batch's oldest, so its worst object), the last log id read, and the batches' costs:
    :data:`BATCH_SUMS` summed, ``batches``, ``update_ms_max`` and ``refill_ms`` summed."""
    rows = r.xrange(keys.serve_batches, min="(" + since if since != "0-0" else "-", max="+")
    lat = [float(f["done_ms"]) - entry_time_ms(f["first"]) for _, f in rows if int(f.get("objects", 1))]
    costs: dict[str, float] = {k: sum(int(f.get(k, 0)) for _, f in rows) for k in BATCH_SUMS}
    costs.update(batches=len(rows), update_ms_max=max((float(f["update_ms"]) for _, f in rows), default=0.0),
                 **{key: sum(float(f.get(key, 0)) for _, f in rows)
                    for key in ("refill_ms", "refill_expire_ms", "refill_search_ms", "refill_routing_ms",
                                "refill_short_ms")})
    return np.asarray(lat, dtype=np.float64), rows[-1][0] if rows else since, costs


def caught_up(r: redis.Redis, keys: Keys, last_id: str) -> bool:
    """Whether the service acknowledged every entry up to ``last_id``: the group delivered it
    and holds nothing pending (recovery acknowledges what was in flight without logging a batch)."""
    g = group_info(r, keys.ingest_objects)
    return g is not None and not g["pending"] and entry_order(g["last-delivered-id"]) >= entry_order(last_id)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True, help="an ingest output directory")
    ap.add_argument("--queries", required=True, help="a query file (the first --queries-n are registered)")
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--window", default="2m")
    ap.add_argument("--rate", type=float, default=2000.0, help="objects/s published")
    ap.add_argument("--duration-s", type=float, default=1200.0, help="publishing time (bound in time)")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--kill-at-s", default="300,1200", help="seconds into publishing to SIGKILL and restart")
    ap.add_argument("--checkpoint-interval", type=float, default=60.0)
    ap.add_argument("--catch-up-s", type=float, default=600.0,
                    help="after publishing, wait at most this long for a restart and the backlog (bound in time)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--check", type=int, default=2000, help="queries checked against the oracle at the end")
    ap.add_argument("--out", help="write the samples and restarts as JSON")
    ap.add_argument("--plot", help="plot memory and latency over time (PNG)")
    ap.add_argument("--log", default=os.devnull, help="the service's output")
    a = ap.parse_args(argv)
    window_ms = parse_duration(a.window)
    kills = sorted(float(x) for x in a.kill_at_s.split(",") if x.strip())

    objects = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None)
    rows = objects.slice(a.initial).to_pylist() or objects.to_pylist()
    queries = pq.read_table(a.queries).slice(0, a.queries_n)
    samples, restarts = [], []
    log = open(a.log, "a")  # noqa: SIM115 - the children write to it until the end
    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        keys = Keys(NAMESPACE)
        t0 = time.perf_counter()
        proc = start_serve(server.url, a, r, keys, log)
        pipe = r.pipeline(transaction=False)
        for q in queries.to_pylist():
            pipe.xadd(keys.ingest_queries, register_fields(q))
        pipe.execute()
        wait_processed(r, keys, proc, timeout_s=3600)
        print(f"serve up and {queries.num_rows:,} queries registered in {time.perf_counter() - t0:.1f} s", flush=True)
        start = time.monotonic()
        pub = Publisher(server.url, keys.ingest_objects, rows, a.rate, start + a.duration_s,
                        keep=int(a.rate * window_ms / 1000 * 2))
        pub.start()
        since, next_sample = "0-0", start + a.sample_s
        pending = None  # a restart not caught up yet: (at, killed, up, last entry id before the kill)
        end = start + a.duration_s + a.catch_up_s
        exact, drained, rejects = None, False, {}
        try:
            while (pub.is_alive() or kills or pending) and time.monotonic() < end:
                now = time.monotonic()
                if kills and now - start >= kills[0] and pending is None:
                    at = kills.pop(0)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    killed = time.monotonic()
                    last = pub.published[-1][0]
                    proc = start_serve(server.url, a, r, keys, log)
                    pending = (at, killed, time.monotonic(), last)
                if pending is not None and caught_up(r, keys, pending[3]):
                    at, killed, up, _ = pending
                    restarts.append({"at_s": at, "status_up_s": round(up - killed, 2),
                                     "caught_up_s": round(time.monotonic() - killed, 2)})
                    print(f"restart at {at:.0f} s: caught up in {restarts[-1]['caught_up_s']} s", flush=True)
                    pending = None
                if proc.poll() is not None:
                    raise SystemExit(f"serve exited with {proc.returncode}")
                if now >= next_sample:
                    next_sample += a.sample_s
                    status = json.loads(r.get(keys.serve_status) or "{}")
                    lat, since, costs = batch_latencies(r, keys, since)
                    row = {"t_s": round(now - start, 1), "published": pub.sent,
                           "redis_used_memory_mb": r.info("memory")["used_memory"] / 2**20,
                           "service_rss_mb": rss_mb(status.get("pid")),
                           "worker_rss_mb": [rss_mb(w.get("pid")) for w in status.get("worker_processes", [])],
                           "live_objects": status.get("objects_held"), "routing_entries": status.get("routing_entries"),
                           "objects_stream_len": r.xlen(keys.ingest_objects),
                           "latency_ms_p50": float(np.percentile(lat, 50)) if len(lat) else None,
                           "latency_ms_p99": float(np.percentile(lat, 99)) if len(lat) else None, **costs}
                    samples.append(row)
                    print(json.dumps(row), flush=True)
                time.sleep(0.2)
            if pending is not None:
                restarts.append({"at_s": pending[0], "status_up_s": round(pending[2] - pending[1], 2),
                                 "caught_up_s": None})
            try:
                wait_processed(r, keys, proc, timeout_s=max(1.0, end - time.monotonic()))
                drained = True
            except AssertionError:
                drained = False
            if a.check and drained:  # the oracle: the published objects the service did not reject, live
                rejected = {f["_entry"] for _, f in r.xrange(keys.ingest_rejects)}
                published = pa.Table.from_pylist([{**o, "t": entry_time_ms(e)} for e, o in pub.published
                                                  if e not in rejected])
                t = published.column("t").to_numpy()
                live = published.filter(pa.array(t > t.max() - window_ms))
                try:
                    exact = assert_exact(server.url, NAMESPACE, queries.slice(0, a.check),
                                         BruteForceKnn(live)) == a.check
                except AssertionError as ex:
                    exact = False
                    print(f"NOT exact: {str(ex)[:2000]}", flush=True)
            rejects = dict(Counter(f["_reason"] for _, f in r.xrange(keys.ingest_rejects)))
        finally:
            pub.stop.set()
            proc.terminate()
            proc.wait(timeout=120)
            log.close()
    out = {"machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
           "config": vars(a), "samples": samples, "restarts": restarts, "exact": exact, "drained": drained,
                          "rejects": rejects,
           "published": pub.sent}
    print(json.dumps({"restarts": restarts, "exact": exact, "published": pub.sent}), flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    if a.plot:
        plot(out, a.plot)
    return 0


def plot(out: dict, path: str) -> None:
    """Memory (Redis, service, workers), latency (p50, p99) and the batches' work (candidates,
    results changed and refilled per object) over time, restarts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = out["samples"]
    t = [x["t_s"] / 60 for x in s]
    fig, (m, lat, work) = plt.subplots(3, 1, figsize=(9, 9.5), sharex=True)
    m.plot(t, [x["redis_used_memory_mb"] for x in s], label="Redis used_memory")
    m.plot(t, [x["service_rss_mb"] for x in s], label="service RSS")
    for w in range(max((len(x["worker_rss_mb"]) for x in s), default=0)):
        m.plot(t, [x["worker_rss_mb"][w] if w < len(x["worker_rss_mb"]) else None for x in s],
               label=f"worker {w} RSS")
    m.set_ylabel("MB")
    m.legend(loc="upper left", fontsize=8)
    lat.plot(t, [x["latency_ms_p50"] for x in s], label="p50")
    lat.plot(t, [x["latency_ms_p99"] for x in s], label="p99")
    lat.set_yscale("log")
    lat.set_ylabel("XADD -> acknowledged, ms")
    lat.legend(loc="upper left", fontsize=8)

    def per_object(key: str) -> list[float | None]:
        return [x[key] / x["objects"] if x.get("objects") else None for x in s]

    work.plot(t, per_object("candidates"), label="candidate pairs")
    work.plot(t, per_object("changed"), label="results changed")
    work.plot(t, per_object("refilled"), label="results refilled")
    work.set_yscale("log")
    work.set_ylabel("per object")
    work.set_xlabel("minutes publishing")
    work.legend(loc="upper left", fontsize=8)
    for ax in (m, lat, work):
        for rs in out["restarts"]:
            ax.axvline(rs["at_s"] / 60, color="grey", linestyle=":")
    fig.suptitle(f"knnmon serve --window {out['config']['window']}: {out['config']['rate']:.0f} objects/s, "
                 f"{out['config']['queries_n']:,} queries")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
