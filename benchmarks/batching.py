"""Response time of ``knnmon serve`` policy by policy, in one sitting: steady rate, bursts, saturation.

One embedded Redis and one set of registered queries; for each phase the service is restarted
with the phase's batching policy and index (the recovery plans the queries with the paper's
assignment), then objects are published through ``knn:ingest:objects``:

- **steady**: ``--rate`` objects/s for ``--steady-s`` seconds;
- **bursts**: ``--bursts`` bursts of ``--burst`` objects, all at once, every ``--burst-every-s``;
- **saturated** (``--saturated N``, only for the phases listed in ``--saturated-phases``): N
  objects as fast as the publisher goes.

Response time per object: from its XADD (the entry id's time, set by Redis) to its effect
written -- the end of its minibatch -- from the ``lat_hist`` of each record of
``knn:serve:batches`` (:mod:`knnmon.coordinator.service.latency`, 5 % buckets). The objects
after the preloaded ones are shuffled (``--seed``), so that every phase streams a statistically
alike slice. The phases run in the given order and then in reverse (ABBA), so that the machine's
drift shows as a difference between the two runs of a phase. ``--check Q`` compares Q queries'
results with the brute-force oracle over every object published that the service did not reject
(a place with more than ``--max-keywords`` keywords is), at the end.

    python -m benchmarks.batching --objects /tmp/full_default --queries /tmp/q100k.parquet \\
        --queries-n 100000 --workers 4 --report /tmp/knnmon-bench/batching.json --plot /tmp/knnmon-bench/batching.png
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.coordinator.bench.speed_probe import speed_probe_ms as speed_probe
from knnmon.coordinator.service import latency
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.redis_server import EmbeddedRedis
from tests.support import assert_exact, register_fields, wait_processed

from benchmarks import serve_load

#: name -> serve flags.
PHASES = {
    "fixed": ["--batching", "fixed", "--max-delay-ms", "20"],
    "no-wait": ["--batching", "no-wait"],
    "adaptive": ["--batching", "adaptive"],
    "no-wait/rtree": ["--batching", "no-wait", "--index", "rtree"],
    "adaptive/rtree": ["--batching", "adaptive", "--index", "rtree"],
    "adaptive/inline-w1": ["--batching", "adaptive", "--executor", "inline", "--workers", "1"],
    "adaptive/ray-w2": ["--batching", "adaptive", "--workers", "2"],
    "adaptive/b5000": ["--batching", "adaptive", "--batch", "5000"],
}


def start(url: str, a: argparse.Namespace, r: redis.Redis, keys: Keys, flags: list[str]) -> subprocess.Popen:
    """``knnmon serve`` with ``flags`` in a child process; returns once it has published its status."""
    r.delete(keys.serve_status)
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", url,
                             "--namespace", keys.namespace, "--objects", a.objects, "--initial", str(a.initial),
                             "--workers", str(a.workers), "--latency-target-ms", str(a.latency_target_ms), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not r.exists(keys.serve_status):
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        time.sleep(0.2)
    return proc


def histogram_since(r: redis.Redis, keys: Keys, since: str) -> tuple[np.ndarray, int, float, float]:
    """The summed response-time histogram of the batch records after ``since``, their count, and
    the first publish and last acknowledgement times (epoch ms)."""
    rows = [f for _, f in r.xrange(keys.serve_batches, min="(" + since, max="+")]
    rows = [f for f in rows if int(f.get("objects", 0))]
    hist = latency.decode(f.get("lat_hist", "") for f in rows)
    last = max((float(f["done_ms"]) for f in rows), default=0.0)
    first = min((int(f["first"].split("-")[0]) for f in rows), default=0)
    return hist, len(rows), float(first), last


def last_record(r: redis.Redis, keys: Keys) -> str:
    tail = r.xrevrange(keys.serve_batches, count=1)
    return tail[0][0] if tail else "0-0"


def summary(hist: np.ndarray) -> dict:
    return {"objects": int(hist.sum()), "mean_ms": latency.mean(hist), "p50_ms": latency.percentile(hist, 50),
            "p99_ms": latency.percentile(hist, 99), "max_ms": latency.percentile(hist, 100)}


def publish(r: redis.Redis, key: str, rows: list[dict], rate: float | None) -> float:
    """XADD ``rows`` paced to ``rate`` objects/s (all at once without a rate); seconds taken."""
    return serve_load.publish(r, key, rows, rate, float("inf"))[1]


def run_phase(name: str, a, r, keys, url, stream: list[dict], at: int) -> tuple[dict, int]:
    """One phase (module docstring), publishing ``stream`` from position ``at``; its row and the next position."""
    t0 = time.perf_counter()
    proc = start(url, a, r, keys, PHASES[name])
    row: dict = {"phase": name, "restart_s": round(time.perf_counter() - t0, 1), "probe_ms": speed_probe()}
    try:
        time.sleep(1.0)  # the first status publish and the workers' warm-up
        n = int(a.rate * a.steady_s)
        mark = last_record(r, keys)
        publish(r, keys.ingest_objects, stream[at:at + n], a.rate)
        at += n
        wait_processed(r, keys, proc, timeout_s=600)
        hist, batches, _, _ = histogram_since(r, keys, mark)
        row["steady"] = {**summary(hist), "rate": a.rate, "batches": batches}
        mark = last_record(r, keys)
        for _ in range(a.bursts):
            t1 = time.perf_counter()
            publish(r, keys.ingest_objects, stream[at:at + a.burst], None)
            at += a.burst
            time.sleep(max(0.0, a.burst_every_s - (time.perf_counter() - t1)))
        wait_processed(r, keys, proc, timeout_s=600)
        hist, batches, first, last = histogram_since(r, keys, mark)
        row["bursts"] = {**summary(hist), "burst": a.burst, "bursts": a.bursts, "batches": batches}
        if a.saturated and name in a.saturated_phases.split(","):
            mark = last_record(r, keys)
            publish(r, keys.ingest_objects, stream[at:at + a.saturated], None)
            at += a.saturated
            wait_processed(r, keys, proc, timeout_s=1200)
            hist, batches, first, last = histogram_since(r, keys, mark)
            row["saturated"] = {"objects": int(hist.sum()), "batches": batches,
                                "objects_per_s": hist.sum() / max((last - first) / 1000, 1e-9)}
    finally:
        proc.terminate()
        proc.wait(timeout=300)
    row["probe_after_ms"] = speed_probe()
    print(json.dumps(row), flush=True)
    return row, at


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["phase"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, part, stats in ((axes[0], "steady", ("p50_ms", "p99_ms")), (axes[1], "bursts", ("mean_ms", "p99_ms"))):
        x = np.arange(len(names))
        for j, stat in enumerate(stats):
            vals = [[r[part][stat] for r in rows if r["phase"] == nm] for nm in names]
            ax.bar(x + (j - 0.5) * 0.38, [np.mean(v) for v in vals], 0.38, label=stat.replace("_ms", ""),
                   yerr=[[np.mean(v) - min(v) for v in vals], [max(v) - np.mean(v) for v in vals]])
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel("response time, publish to result (ms)")
        ax.set_title(part if part == "bursts" else f"steady {rows[0]['steady']['rate']:.0f} objects/s")
        ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--queries-n", type=int, default=100_000)
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--phases", default="fixed,no-wait,adaptive,adaptive/rtree")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=5000)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--burst-every-s", type=float, default=2.0)
    ap.add_argument("--saturated", type=int, default=0, help="objects published unpaced per listed phase")
    ap.add_argument("--saturated-phases", default="fixed,adaptive")
    ap.add_argument("--latency-target-ms", type=float, default=50.0)
    ap.add_argument("--no-abba", action="store_true", help="run the phases once, not again in reverse")
    ap.add_argument("--warmup", metavar="PHASE",
                    help="run this phase first and leave it out of the report (the first phase after the "
                         "registrations ran 2-3x slower in bursts in the first two sittings)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", type=int, default=0)
    ap.add_argument("--report")
    ap.add_argument("--plot")
    a = ap.parse_args(argv)
    names = a.phases.split(",")
    unknown = [n for n in names + ([a.warmup] if a.warmup else []) if n not in PHASES]
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; known: {list(PHASES)}")
    order = names if a.no_abba else names + names[::-1]

    objects = stream_order(read_objects(a.objects, ["id", "lon", "lat", "t", "keywords"]), None)
    rest = objects.slice(a.initial)
    rest = rest.take(pa.array(np.random.default_rng(a.seed).permutation(rest.num_rows)))
    per_phase = int(a.rate * a.steady_s) + a.burst * a.bursts
    need = (len(order) + bool(a.warmup)) * per_phase + a.saturated * sum(
        n in a.saturated_phases.split(",") for n in order + ([a.warmup] if a.warmup else []))
    if need > rest.num_rows:
        raise SystemExit(f"the phases need {need:,} objects beyond the initial ones; {rest.num_rows:,} there")
    stream = rest.slice(0, need).to_pylist()
    queries = pq.read_table(a.queries).slice(0, a.queries_n)
    rows: list[dict] = []
    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        keys = Keys("bench")
        t0 = time.perf_counter()
        proc = start(server.url, a, r, keys, PHASES[names[0]])
        pipe = r.pipeline(transaction=False)
        for q in queries.to_pylist():
            pipe.xadd(keys.ingest_queries, register_fields(q))
        pipe.execute()
        wait_processed(r, keys, proc, timeout_s=3600)
        proc.terminate()
        proc.wait(timeout=300)
        print(f"{queries.num_rows:,} queries registered in {time.perf_counter() - t0:.1f} s", flush=True)
        at, warm = 0, None
        if a.warmup:
            warm, at = run_phase(a.warmup, a, r, keys, server.url, stream, at)
            warm["warmup"] = True
        for name in order:
            row, at = run_phase(name, a, r, keys, server.url, stream, at)
            rows.append(row)
        exact = None
        if a.check:  # the oracle: the preloaded objects and the published ones the service did not reject
            rejected = {f.get("id") for _, f in r.xrange(keys.ingest_rejects)}
            accepted = [o for o in stream[:at] if o["id"] not in rejected]
            seen = pa.concat_tables([objects.slice(0, a.initial), pa.Table.from_pylist(accepted, schema=rest.schema)])
            exact = assert_exact(server.url, keys.namespace, queries.slice(0, a.check), BruteForceKnn(seen)) == a.check
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": __import__("os").cpu_count()},
              "command": " ".join(sys.argv), "config": vars(a), "rows": rows, "checked_queries": a.check,
              "exact": exact, "warmup": warm}
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    if a.plot:
        plot(rows, a.plot)
    print(json.dumps({"exact": exact}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
