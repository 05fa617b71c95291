"""Chaos soak: ``knnmon serve --window`` at load while faults are injected on a schedule (issue 35).

A durable Redis of its own (the embedded server, AOF on), a local 3-node Ray cluster
(``deploy/local-cluster.sh``), ``knnmon serve --window 10m --ray-address ...``. The window is
filled first, as a service that has run for a while holds it: ``--prefill`` places (one
window less ``--lead-s`` at ``--rate``) published with times spread evenly over the window as of
when the stream starts, ``--lead-s`` from now; then ``--queries-n`` queries (100 k) are
registered (their exact kNN over the window); once the service has applied both (and the lead
has passed), the clock starts and objects are published at ``--rate`` (1,000/s)
without ``t`` (they take their entry's time) for ``--duration-s`` (30 minutes), all the places
in stream order, again under new ids once they run out. Throughout: query registrations and
unregisters (``--churn-per-s``), and
``--hostile`` (1 %) of the entries hostile -- every reject reason an input can earn, far-future and
far-past times, huge ``k``, oversize and non-UTF-8 fields -- each with the reason it must get.
Faults, at the given seconds into publishing:

- SIGKILL of a Ray worker process, once in every ``--worker-kill-every-s`` (5 min), at a random
  point of it;
- one SIGKILL of the service (restarted at once, as a supervisor would);
- one Redis restart (stopped, saving, and started again on the same port);
- one restart of a worker node of the Ray cluster.

After each fault has been absorbed, and at the end, publishing pauses until the service has
caught up and the sampled results are read (``chaos_check``: a few seconds; a pause moves the
watermark by its length when the stream resumes), then ``--check`` registered queries are compared
with the brute-force oracle over the live objects the service accepted; the change feed must
show no change applied twice, and every entry must be acknowledged. Every ``--sample-s`` it
records throughput, the stream's lag (age of the oldest entry waiting), the RSS and the private
memory (RSS less its file-backed and shared pages: Ray's object store is shared memory its
processes map) of every process (service, workers, Redis, each Ray node's processes) and
latency; per minute it reports
latency p50/p99 (XADD -> acknowledged, from the service's batch log) and objects/s. Writes a JSON
report and a plot.

    python -m tests.system.chaos_soak --objects /tmp/full --queries /tmp/q100k.parquet \\
        --out /tmp/knnmon-bench/chaos_soak.json --plot /tmp/knnmon-bench/chaos_soak.png --log-dir /tmp/chaos
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import redis

from tests.system.chaos_faults import (NAMESPACE, Chaos, inject, node_rss_mb, processes_mb, redis_pid, rss,
                                     workers_of)
from tests.system.chaos_check import AcceptedMirror, check, queries_done, verify
from tests.system.chaos_load import Publisher, publish_prefill
from tests.system.soak import caught_up  # the plain soak's helpers

from knnmon.coordinator.service.status import read_status  # noqa: E402
from tests.support import register_fields  # noqa: E402
from knnmon.ingest.reading import read_objects, stream_order  # noqa: E402
from knnmon.keys import Keys  # noqa: E402
from knnmon.protocol import entry_time_ms  # noqa: E402
from knnmon.window import parse_duration  # noqa: E402


def per_minute(r: redis.Redis, keys: Keys, start_ms: int) -> list[dict]:
    """Per minute of publishing: latency p50/p99 (XADD -> acknowledged of each batch's oldest
    object, ms), objects applied per second, batches, the largest update time."""
    rows = r.xrange(keys.serve_batches)
    by: dict[int, list] = {}
    for _, f in rows:
        if not int(f.get("objects", 0)):
            continue
        minute = int((float(f["done_ms"]) - start_ms) // 60_000)
        if minute >= 0:
            by.setdefault(minute, []).append(f)
    out = []
    for m in sorted(by):
        fs = by[m]
        lat = np.array([float(f["done_ms"]) - entry_time_ms(f["first"]) for f in fs])
        out.append({"minute": m, "latency_ms_p50": float(np.percentile(lat, 50)),
                    "latency_ms_p99": float(np.percentile(lat, 99)), "objects_per_s": sum(int(f["objects"]) for f in fs)
                    / 60, "batches": len(fs), "update_ms_max": max(float(f["update_ms"]) for f in fs),
                    "refilled": sum(int(f.get("refilled", 0)) for f in fs)})
    return out


def revival_times(log: Path) -> list[float]:
    """Seconds of each in-place revival, from the service's log."""
    text = log.read_text(errors="replace")
    return [float(m.group(1)) for m in re.finditer(r"worker \d+ revived: .* in ([0-9.]+) s", text)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True, help="an ingest output directory")
    ap.add_argument("--queries", required=True, help="a query file: the first --queries-n registered, the rest churn")
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--prefill", type=int, help="objects published with times spread over the window before the "
                                                "queries are registered (default: rate x (window - lead))")
    ap.add_argument("--lead-s", type=float, default=150.0,
                    help="seconds the setup (the registration, the prefill applied) is given: the prefill's times "
                         "end this long before the stream starts, so nothing expires at once when it does")
    ap.add_argument("--window", default="10m")
    ap.add_argument("--rate", type=float, default=1000.0, help="objects/s published")
    ap.add_argument("--duration-s", type=float, default=1800.0, help="publishing time")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--churn-per-s", type=float, default=2.0, help="query registrations (and unregisters) per second")
    ap.add_argument("--hostile", type=float, default=0.01, help="share of object entries that are hostile")
    ap.add_argument("--worker-kill-every-s", type=float, default=300.0)
    ap.add_argument("--service-kill-at-s", type=float, default=720.0)
    ap.add_argument("--redis-restart-at-s", type=float, default=1020.0)
    ap.add_argument("--node-restart-at-s", type=float, default=1320.0)
    ap.add_argument("--check", type=int, default=2000, help="queries checked against the oracle after each fault")
    ap.add_argument("--check-after-s", type=float, default=60.0, help="check this long after each fault")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="the JSON report")
    ap.add_argument("--plot", help="the time series plot (PNG)")
    ap.add_argument("--log-dir", default="/tmp/knnmon-chaos", help="Redis, cluster and service files and logs")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what it started (finally below)
    window_ms = parse_duration(a.window)
    rng = random.Random(a.seed)
    faults = [(k * a.worker_kill_every_s + rng.uniform(0.1, 0.9) * a.worker_kill_every_s, "worker_kill")
              for k in range(int(a.duration_s // a.worker_kill_every_s))]
    faults += [(a.service_kill_at_s, "service_kill"), (a.redis_restart_at_s, "redis_restart"),
               (a.node_restart_at_s, "node_restart")]
    faults = sorted(f for f in faults if f[0] < a.duration_s)

    objects = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None)
    rows = objects.drop_columns(["t"]).to_pylist()  # published without t, or with the prefill's
    lead_ms = int(a.lead_s * 1000)
    prefill = int(a.rate * max(window_ms - lead_ms, 0) / 1000) if a.prefill is None else a.prefill
    all_queries = pq.read_table(a.queries)
    queries = all_queries.slice(0, a.queries_n)
    extra = all_queries.slice(a.queries_n).to_pylist()
    extra.reverse()
    chaos = Chaos(a)
    samples, events, checks, started = [], [], [], time.time()
    keys = Keys(NAMESPACE)
    try:
        r = redis.Redis.from_url(chaos.url, decode_responses=True, encoding_errors="surrogateescape", socket_timeout=30)
        t0 = time.perf_counter()
        chaos.start_service(r, keys)
        # The window as a service that has run a while holds it, as of when the stream starts:
        # the prefill's times span the window but its last --lead-s (the setup's time), so that
        # the stream's first batches expire the oldest at the stream's own pace, not the
        # registration's worth at once (a wave no steady service meets).
        now = int(time.time() * 1000)
        stream_at_ms = now + lead_ms
        filled = publish_prefill(r, keys, rows[:prefill], stream_at_ms - window_ms, now, "p")
        mirror = AcceptedMirror(chaos.url, keys, window_ms + 60_000)
        mirror.start()
        used = prefill
        pipe = r.pipeline(transaction=False)
        for q in queries.to_pylist():
            pipe.xadd(keys.ingest_queries, register_fields(q))
        pipe.execute()
        last_prefilled = filled[-1][0] if filled else "0-0"
        while not (queries_done(chaos.url) and caught_up(r, keys, last_prefilled)):
            time.sleep(1)
        rows = rows[used:] + rows[:used]
        setup_s = time.perf_counter() - t0
        late_s = (time.time() * 1000 - stream_at_ms) / 1000
        if late_s < 0:
            time.sleep(-late_s)
        print(f"serve up on the 3-node cluster, {queries.num_rows:,} queries registered and {len(filled):,} objects "
              f"prefilled in {setup_s:.1f} s ({'%.1f s over' % late_s if late_s > 0 else 'within'} the lead)",
              flush=True)
        start = time.monotonic()
        start_ms = int(time.time() * 1000)
        pub = Publisher(chaos.url, keys, rows, extra, a, start + a.duration_s)
        pub.published = filled
        pub.start()
        checks_due: list = []
        sampler = Sampler(chaos, r, keys, pub, start, a.sample_s)
        sampler.start()
        samples = sampler.samples
        while pub.is_alive():
            now = time.monotonic()
            if faults and now - start >= faults[0][0]:
                at, kind = faults.pop(0)
                events.append(inject(chaos, r, keys, kind, now - start))
                checks_due.append((now + a.check_after_s, kind))
            if checks_due and now >= checks_due[0][0] and pub.is_alive():
                _, kind = checks_due.pop(0)
                checks.append(check(chaos, r, keys, pub, mirror, queries, f"after {kind}", 600))
            if chaos.service.poll() is not None:
                raise SystemExit(f"serve exited with {chaos.service.returncode}")
            time.sleep(0.2)
        sampler.stop()
        checks.append(check(chaos, r, keys, pub, mirror, queries, "end", 900))
        mirror.stop()
        checks = [verify(c, keys, pub, window_ms) for c in checks]
        hostile = verify_hostile(r, keys, pub)
        report = {
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))},
            "config": vars(a), "start_ms": start_ms, "setup_s": round(setup_s, 1),
            "setup_over_lead_s": round(max(late_s, 0.0), 1),
            "published": pub.sent, "hostile_sent": len(pub.hostile),
            "publisher_errors": pub.errors, "events": events, "checks": checks, "samples": samples,
            "minutes": per_minute(r, keys, start_ms), "revivals_s": revival_times(chaos.dir / "serve.log"),
            "rejects_by_reason": dict(Counter(f["_reason"] for _, f in r.xrange(keys.ingest_rejects))),
            "hostile": hostile, "final_status": (read_status(chaos.url, NAMESPACE).get("service") or {}),
        }
        report["summary"] = summarize(report, window_ms)
        print(json.dumps(report["summary"], indent=1), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1))
        if a.plot:
            plot(report, a.plot)
    finally:
        chaos.close()
    return 0


class Sampler(threading.Thread):
    """:func:`sample` every ``every_s`` from ``start`` (monotonic), in its own thread: a fault's
    injection and the checks, which the main loop waits for, do not hold the samples back (when a
    sample took longer than ``every_s``, the next is taken at once and those missed are skipped,
    not taken late in a burst)."""

    def __init__(self, chaos: Chaos, r: redis.Redis, keys: Keys, pub, start: float, every_s: float) -> None:
        super().__init__(daemon=True, name="sampler")
        self.args, self.start_at, self.every_s = (chaos, r, keys, pub), start, every_s
        self.samples: list[dict] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        due = self.start_at + self.every_s
        while not self._stop_event.wait(max(due - time.monotonic(), 0.0)):
            now = time.monotonic()
            due += self.every_s * max(1, int((now - due) // self.every_s) + 1)
            self.samples.append(sample(*self.args, now - self.start_at))
            print(json.dumps(self.samples[-1]), flush=True)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=120)


def sample(chaos: Chaos, r: redis.Redis, keys: Keys, pub: Publisher, t_s: float) -> dict:
    try:
        st = read_status(chaos.url, NAMESPACE)
    except Exception as ex:  # noqa: BLE001 - Redis away during its restart
        return {"t_s": round(t_s, 1), "error": f"{type(ex).__name__}"}
    svc = st.get("service") or {}
    return {"t_s": round(t_s, 1), "published": pub.sent, "objects_applied": svc.get("objects"),
            "lag_ms": st["objects_stream"].get("oldest_waiting_ms"),
            "undelivered": st["objects_stream"].get("undelivered"), "pending": st["objects_stream"].get("pending"),
            "rss_mb": {"service": rss(svc.get("pid")), "redis": rss(redis_pid(chaos)),
                       **{f"worker{w['worker']}": rss(w.get("pid")) for w in workers_of(st)},
                       **{f"ray_{n}": node_rss_mb(chaos.dir / "cluster" / f"{n}.pid")
                          for n in ("head", "worker1", "worker2")}},
            "processes_mb": processes_mb({"service": svc.get("pid"), "redis": redis_pid(chaos),
                                          **{f"worker{w['worker']}": w.get("pid") for w in workers_of(st)}},
                                         {n: chaos.dir / "cluster" / f"{n}.pid"
                                          for n in ("head", "worker1", "worker2")}),
            "live_objects": svc.get("objects_held"), "routing_entries": svc.get("routing_entries"),
            **{k: svc.get(k) for k in ("workers_revived", "recoveries", "worker_restarts", "redis_outages", "late")},
            "latency_ms_p99_status": svc.get("latency_ms_p99"), "gc_full_passes": svc.get("gc_full_passes")}


def verify_hostile(r: redis.Redis, keys: Keys, pub: Publisher) -> dict:
    """Each hostile entry's reject record has the reason it must get (entries by stream and id:
    the two ingest streams can hand out the same id)."""
    got = {(f["_stream"], f["_entry"]): f["_reason"] for _, f in r.xrange(keys.ingest_rejects)}
    wrong = [(s, e, want, got.get((s, e))) for s, e, want in pub.hostile if got.get((s, e)) != want]
    return {"sent": len(pub.hostile), "by_reason": dict(Counter(w for _, _, w in pub.hostile)),
            "wrong": wrong[:50], "all_rejected_with_their_reason": not wrong}


def summarize(rep: dict, window_ms: int) -> dict:
    """The issue's targets, from the report."""
    fault_minutes = {int(e["at_s"] // 60) for e in rep["events"]} | {int(e["at_s"] // 60) + 1 for e in rep["events"]}
    lat_ok = [m["latency_ms_p99"] <= 1000 for m in rep["minutes"] if m["minute"] not in fault_minutes]
    lags = [s["lag_ms"] for s in rep["samples"] if s.get("lag_ms") is not None]
    growth = {}
    for name in {k for s in rep["samples"] for k in (s.get("rss_mb") or {})}:
        def at(lo, hi):
            v = [s["rss_mb"].get(name) for s in rep["samples"]
                 if lo <= s["t_s"] < hi and (s.get("rss_mb") or {}).get(name)]
            return float(np.median(v)) if v else None
        a, b = at(540, 600), at(rep["config"]["duration_s"] - 60, rep["config"]["duration_s"])
        growth[name] = round(100 * (b - a) / a, 1) if a and b else None
    return {"lag_ms_p99": float(np.percentile(lags, 99)) if lags else None,
            "rss_growth_pct_per_process": process_growth(rep),
            "minutes_p99_le_1s_outside_faults": f"{sum(lat_ok)}/{len(lat_ok)}",
            "revivals_s": rep["revivals_s"], "events": [(e["kind"], e.get("served_again_s")) for e in rep["events"]],
            "rss_growth_pct_min10_to_end": growth, "checks": [(c["label"], c["exact"], c.get("applied_once"))
                                                             for c in rep["checks"]],
            "hostile_ok": rep["hostile"]["all_rejected_with_their_reason"], "published": rep["published"]}


def process_growth(rep: dict, first_s: float = 540.0, settle_s: float = 60.0, least_s: float = 600.0) -> dict:
    """Each process's growth of RSS and of private memory (:func:`chaos_faults.processes_mb`), %:
    the median of its first minute from ``first_s`` on (or from ``settle_s`` after it appeared,
    if later) to the median of its last minute, for every process sampled over at least
    ``least_s`` of that span (``"pid:role": [role, RSS %, private %, from s, to s]``, largest
    private growth first; a process that changes role counts anew from then); a process that
    lived less (replaced by a fault) is left out."""
    seen: dict[str, list] = {}
    for s in rep["samples"]:
        for pid, (role, *mb) in (s.get("processes_mb") or {}).items():
            # (a process that changes role, e.g. the spare actor becoming a revived worker, counts anew)
            # (a report from before private memory was sampled: RSS for both)
            seen.setdefault(f"{pid}:{role}", [role, []])[1].append((s["t_s"], mb[0], mb[-1]))
    out = {}
    for pid, (role, pts) in seen.items():
        start = max(first_s, pts[0][0] + (settle_s if pts[0][0] > first_s - settle_s else 0.0))
        pts = [p for p in pts if p[0] >= start]
        if not pts or pts[-1][0] - pts[0][0] < least_s:
            continue
        a = np.median([p[1:3] for p in pts if p[0] < pts[0][0] + 60], axis=0)
        b = np.median([p[1:3] for p in pts if p[0] > pts[-1][0] - 60], axis=0)
        if (a > 0).all():
            rss_pct, own_pct = (100 * (b - a) / a).round(1).tolist()
            out[pid] = [role, rss_pct, own_pct, pts[0][0], pts[-1][0]]
    return dict(sorted(out.items(), key=lambda x: -x[1][2]))


def plot(rep: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = [x for x in rep["samples"] if "error" not in x]
    t = [x["t_s"] / 60 for x in s]
    fig, (thr, lat, lag, mem) = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    mins = rep["minutes"]
    thr.step([m["minute"] + 1 for m in mins], [m["objects_per_s"] for m in mins], label="objects applied/s")
    thr.axhline(rep["config"]["rate"] * (1 - rep["config"]["hostile"]), color="grey", ls="--", label="published/s")
    thr.set_ylabel("objects/s")
    thr.legend(fontsize=8)
    lat.step([m["minute"] + 1 for m in mins], [m["latency_ms_p50"] for m in mins], label="p50")
    lat.step([m["minute"] + 1 for m in mins], [m["latency_ms_p99"] for m in mins], label="p99")
    lat.axhline(1000, color="grey", ls="--")
    lat.set_yscale("log")
    lat.set_ylabel("XADD -> ack, ms (per minute)")
    lat.legend(fontsize=8)
    lag.plot(t, [x.get("lag_ms") or 0 for x in s])
    lag.axhline(5000, color="grey", ls="--")
    lag.set_ylabel("lag (oldest waiting), ms")
    for name in sorted({k for x in s for k in x["rss_mb"]}):
        mem.plot(t, [x["rss_mb"].get(name) for x in s], label=name)
    mem.set_ylabel("RSS, MB")
    mem.set_xlabel("minutes publishing")
    mem.legend(fontsize=7, ncol=3)
    for ax in (thr, lat, lag, mem):
        for e in rep["events"]:
            ax.axvline(e["at_s"] / 60, color="red", ls=":", lw=0.8)
    fig.suptitle(f"knnmon serve --window {rep['config']['window']} chaos soak: {rep['config']['rate']:.0f} objects/s, "
                 f"{rep['config']['queries_n']:,} queries, faults (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
