"""Benchmark: the paper's largest setting on one machine (Tsuruoka et al. 2019, §5: up to 3 M
queries over 20 M geo-tagged tweets), end to end, with the memory of every process.

Usage (the figures in docs/performance.md, "The paper's scale"):

    knnmon ingest synthetic --n 20000000 --out /tmp/synth20m
    knnmon queries generate --objects /tmp/synth20m --n 3000000 --kmax 10 --seed 3 --out /tmp/sq3m.parquet
    python benchmarks/paper_scale.py --objects /tmp/synth20m --queries /tmp/sq3m.parquet \
        --n 3000000 --workers 12 --algorithms proposed --batches 100 --report /tmp/knnmon-bench/paper_scale.json

Each run (a query count ``n``: the query file's first ``n`` rows; a worker count ``W``; an
algorithm) is its own child process doing what ``knnmon run`` does: read the first ``initial``
objects and the ``batches x batch`` streamed after them (only those rows are read), compute every
query's exact initial kNN, plan, start ``W`` Ray workers and an embedded Redis, load the initial
results, stream the batches one at a time (``in_flight = 1``: the paper's update time), then
check a seeded sample of ``check_sample`` queries' Redis results against the brute-force oracle
over every object seen.

While a run lasts this parent samples, once a second, every process of the child's tree (the
coordinator, Ray's GCS, raylet and helpers, the worker actors, redis-server): RSS and PSS per
process (``psutil``). Reported per run: the peak of the tree's summed PSS (shared pages, such as
Ray's object store, counted once: the figure the 20 GB target is checked on) and summed RSS, each
role's peak RSS (``coordinator``, ``worker``, ``redis``, ``ray``), the machine's used memory
(``MemTotal - MemAvailable``) at its peak minus before the run, the child's timings (read,
initial kNN, plan, start-up), objects/s, update time (ms per batch), Redis's own ``used_memory``
(and per query), the coordinator's RSS after the stream, each worker's RSS after the stream and
its bytes per query over an idle worker's (:func:`per_query_in_workers`), and the oracle check.
Each row also carries the per-worker figures issue 37 compares: the plan's predicted load and
the measured busy time per worker (``predicted_worker_loads``, ``busy_ms_per_worker``), per
batch the busy times, routing CPU and per-worker counts; ``ideal`` in ``--algorithms`` runs every
query on one worker once per ``n`` and adds, for each ``W``, the bound no assignment beats
(:mod:`knnmon.coordinator.bench.ideal`, priced from the other algorithms' rows at that ``n``
and ``W``). The report is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

ROLES = ("coordinator", "worker", "redis", "ray")


def role_of(proc: psutil.Process, child_pid: int, child_cmdline: list[str]) -> str:
    """Which part of a run a process is: the child itself and the processes it forks (the
    initial kNN's) are the coordinator."""
    if proc.pid == child_pid:
        return "coordinator"
    try:
        cmdline = proc.cmdline()
        name = " ".join(cmdline[:2]) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "ray"
    if cmdline == child_cmdline:
        return "coordinator"
    if "redis-server" in name:
        return "redis"
    if "KnnWorker" in name:
        return "worker"
    return "ray"


def used_bytes() -> int:
    """The machine's used memory, ``MemTotal - MemAvailable`` (bytes)."""
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def watch(child: subprocess.Popen, timeout_s: float, interval_s: float = 1.0) -> dict[str, Any]:
    """Sample ``child``'s process tree until it exits (killed after ``timeout_s``)."""
    root = psutil.Process(child.pid)
    root_cmdline = root.cmdline()
    base_used = used_bytes()
    peak: dict[str, Any] = {"pss_sum": 0, "rss_sum": 0, "used": 0, "processes": 0}
    role_peak = dict.fromkeys(ROLES, 0)
    per_pid: dict[int, tuple[str, int]] = {}
    timeline: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while child.poll() is None:
        if time.monotonic() - t0 > timeout_s:
            child.kill()
            break
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        pss = rss = 0
        for p in procs:
            try:
                m = p.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            pss += m.pss
            rss += m.rss
            # (again each time: a Ray worker names itself once it hosts an actor)
            role = role_of(p, child.pid, root_cmdline)
            if role == "ray" and per_pid.get(p.pid, ("ray",))[0] != "ray":
                role = per_pid[p.pid][0]  # an actor's process keeps its role while it exits
            per_pid[p.pid] = (role, max(m.rss, per_pid.get(p.pid, (role, 0))[1]))
            role_peak[role] = max(role_peak[role], m.rss)
        peak["pss_sum"], peak["rss_sum"] = max(peak["pss_sum"], pss), max(peak["rss_sum"], rss)
        peak["used"] = max(peak["used"], used_bytes() - base_used)
        peak["processes"] = max(peak["processes"], len(procs))
        timeline.append((round(time.monotonic() - t0, 1), round(pss / 2**30, 3)))
        time.sleep(interval_s)
    child.wait()
    workers = sorted(r for role, r in per_pid.values() if role == "worker")
    return {"peak_pss_sum_gb": round(peak["pss_sum"] / 2**30, 2), "peak_rss_sum_gb": round(peak["rss_sum"] / 2**30, 2),
            "peak_used_gb": round(peak["used"] / 2**30, 2), "processes": peak["processes"],
            "role_peak_rss_gb": {k: round(v / 2**30, 2) for k, v in role_peak.items()},
            "worker_peak_rss_gb": [round(r / 2**30, 2) for r in workers],
            "wall_s": round(time.monotonic() - t0, 1), "pss_timeline_gb": timeline[::5]}


def per_query_in_workers(redis_url: str, workers: list[Any]) -> dict[str, Any]:
    """Bytes per query held in the workers after the stream: each worker's memory now less that
    of an idle worker started beside them (same actor class and options, no queries: the Ray
    worker process, its imports and warm-up), divided by the queries it holds. Counted on the
    anonymous RSS (``RssAnon``: the worker's own heap; its RSS also holds the pages of Ray's
    object store it read its load from, shared with the store), the RSS beside it. The peak RSS
    includes the initial load's transient payloads; this is what a worker keeps."""
    from dataclasses import asdict

    import ray

    from knnmon.coordinator.runtime.ray_pool import WORKER_CPUS
    from knnmon.workers.actor import WorkerActor
    from knnmon.workers.settings import WorkerSettings

    stats = [asdict(w) for w in workers]

    if not ray.is_initialized() or any(w.get("rss_anon_mb") is None for w in stats):
        return {}
    idle_actor = WorkerActor(num_cpus=WORKER_CPUS).remote(len(stats), WorkerSettings(redis_url, "scale-idle"))
    idle = asdict(ray.get(idle_actor.stats.remote(), timeout=120))
    ray.kill(idle_actor)
    held = [(w["rss_anon_mb"] - idle["rss_anon_mb"]) * 2**20 / max(w["queries"], 1) for w in stats]
    return {"worker_queries": [w["queries"] for w in stats],
            "worker_rss_mb_after": [round(w["rss_mb"], 1) for w in stats],
            "worker_rss_anon_mb_after": [round(w["rss_anon_mb"], 1) for w in stats],
            "idle_worker_rss_mb": round(idle["rss_mb"], 1), "idle_worker_rss_anon_mb": round(idle["rss_anon_mb"], 1),
            "worker_bytes_per_query": [round(b) for b in held], "worker_bytes_per_query_max": round(max(held))}


def run_child(a: argparse.Namespace) -> None:
    """One run (module docstring); writes its JSON to ``a.child_report``."""
    import numpy as np
    import pyarrow as pa

    from knnmon.connection import connect
    from knnmon.coordinator.bench.oracle_check import mismatches
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.heap import resident_bytes
    from knnmon.ingest.reading import load_queries
    from knnmon.store import StoreConfig

    t0 = time.perf_counter()
    queries = load_queries(a.queries).slice(0, a.n)
    one = a.algorithms[0] == "ideal"  # (every query on one worker: the ideal's counts)
    config = RunConfig(workers=1 if one else a.workers[0], algorithm="random" if one else a.algorithms[0],
                       initial=a.initial, batch=a.batch,
                       batches=a.batches, in_flight=1, seed=a.seed, sets_per_worker=a.sets_per_worker,
                       store=StoreConfig(namespace="scale", data_dir=None))
    out: dict[str, Any] = {}
    with Runtime(a.objects, queries, config) as rt:
        out["startup_wall_s"] = round(time.perf_counter() - t0, 1)
        s = rt.run(progress=False)
        info = connect(rt.store.url).info("memory")
        out.update({"kmax": int(queries.column("k").to_numpy().max()), "objects_per_s": s.objects_per_s,
                    "update_ms_mean": s.update_ms_mean,
                    "update_ms_p50": s.update_ms_p50, "update_ms_p99": s.update_ms_p99,
                    "update_ms_sim_mean": s.update_ms_sim_mean, "deliveries_per_object": s.deliveries_per_object,
                    "batches": s.batches, "objects": s.objects, "queries": s.queries,
                    "initial_objects": s.initial_objects, "timings_s": {k: round(v, 1) for k, v in s.startup_s.items()},
                    "plan": {k: v for k, v in rt.plan.summary.items() if not isinstance(v, list | dict)},
                    "worker_peak_rss_mb_self": [round(w["peak_rss_mb"], 1) for w in s.workers_stats],
                    "workers": rt.config.workers, "route_cpu_ms_mean": s.route_cpu_ms_mean,
                    "predicted_worker_loads": s.predicted_worker_loads, "busy_ms_per_worker": s.busy_ms_per_worker,
                    "busy_ms_per_batch": [r.busy_ms for r in rt.reports],
                    "index_ms_per_batch": [r.index_ms for r in rt.reports],
                    "redis_server_ms_per_batch": [r.redis_server_ms for r in rt.reports],
                    "compactions_per_batch": [[r.index_merges, r.handle_compactions] for r in rt.reports],
                    "route_cpu_ms_per_batch": [r.route_cpu_ms for r in rt.reports],
                    "per_worker_per_batch": [r.per_worker for r in rt.reports],
                    "redis_used_memory_gb": round(info["used_memory"] / 2**30, 2),
                    "redis_used_memory_peak_gb": round(info["used_memory_peak"] / 2**30, 2),
                    "redis_bytes_per_query": round(info["used_memory"] / max(queries.num_rows, 1)),
                    "coordinator_rss_gb_after": round(resident_bytes() / 2**30, 2),
                    **per_query_in_workers(rt.store.url, s.workers_stats)})
        seen = pa.concat_tables([rt.prepared.initial, rt.stream_table]).select(["id", "lon", "lat", "keywords"])
        pick = np.sort(np.random.default_rng(a.seed).choice(queries.num_rows, min(a.check_sample, queries.num_rows),
                                                            replace=False))
        t1 = time.perf_counter()
        bad = mismatches(rt.store.url, "scale", queries.take(pa.array(pick)), seen)
        out.update({"checked_queries": len(pick), "mismatched_queries": len(bad), "exact": not bad,
                    "check_s": round(time.perf_counter() - t1, 1)})
    with open(a.child_report, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True, help="an ingest output (20 M synthetic objects)")
    p.add_argument("--queries", required=True, help="a query file with at least max(--n) rows")
    p.add_argument("--n", default="1000000,2000000,3000000", help="query counts, comma-separated")
    p.add_argument("--workers", default="12,24", help="worker counts, comma-separated")
    p.add_argument("--algorithms", default="proposed,random")
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--batches", type=int, default=100, help="streamed batches per run (bounded)")
    p.add_argument("--check-sample", type=int, default=2000, help="queries checked against the oracle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sets-per-worker", type=int, default=8, help="the proposed plan's sets per worker")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a run is killed")
    p.add_argument("--report", help="JSON report path")
    p.add_argument("--child-report", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.workers = [int(x) for x in str(a.workers).split(",")]
    a.algorithms = a.algorithms.split(",")
    if a.child_report:
        a.n = int(a.n)
        run_child(a)
        return
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "date": time.strftime("%Y-%m-%d %H:%M")}
    report: dict[str, Any] = {"machine": machine, "args": {k: v for k, v in vars(a).items() if k != "child_report"},
                              "rows": []}
    for n in [int(x) for x in a.n.split(",")]:
        runs = [(w, algo) for w in a.workers for algo in a.algorithms if algo != "ideal"]
        for w, algo in runs + ([(1, "ideal")] if "ideal" in a.algorithms else []):
            with tempfile.TemporaryDirectory() as tmp:
                child_report = os.path.join(tmp, "run.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--objects", a.objects, "--queries", a.queries,
                       "--n", str(n), "--workers", str(w), "--algorithms", algo, "--initial", str(a.initial),
                       "--batch", str(a.batch), "--batches", str(a.batches), "--check-sample",
                       str(a.check_sample), "--seed", str(a.seed), "--sets-per-worker", str(a.sets_per_worker),
                       "--child-report", child_report]
                print(f"paper_scale: n={n:,} W={w} {algo}", file=sys.stderr, flush=True)
                child = subprocess.Popen(cmd)
                mem = watch(child, a.timeout)
                row: dict[str, Any] = {"n": n, "workers": w, "algorithm": algo, "exit": child.returncode, **mem}
                if os.path.exists(child_report):
                    with open(child_report, encoding="utf-8") as fh:
                        row.update(json.load(fh))
            if algo == "ideal" and row.get("per_worker_per_batch"):
                row = {**row, "algorithm": "ideal-one-worker"}
                report["rows"] += [ideal_at(row, n, v, report["rows"]) for v in a.workers]
            report["rows"].append(row)
            print(f"  exit {row['exit']}, {row['wall_s']} s, peak PSS {row['peak_pss_sum_gb']} GB, "
                  f"{row.get('objects_per_s', 0):,.0f} obj/s, exact={row.get('exact')}", file=sys.stderr, flush=True)
            if a.report:
                with open(a.report, "w", encoding="utf-8") as fh:
                    json.dump(report, fh, indent=1)


def ideal_at(one: dict[str, Any], n: int, workers: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ideal row at ``workers`` from the one-worker run ``one``, priced from the rows of ``n``
    queries at ``workers`` (:func:`knnmon.coordinator.bench.ideal.ideal_row`)."""
    from knnmon.coordinator.bench.ideal import ideal_row

    same = [r for r in rows if r["n"] == n and r["workers"] == workers and r.get("per_worker_per_batch")
            and not r["algorithm"].startswith("ideal")]
    row = ideal_row({**one, "workers": 1}, workers, same)
    return {**row, "n": n, "algorithm": "ideal"}


if __name__ == "__main__":
    main()
