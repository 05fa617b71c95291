"""Benchmark: ``knnmon plan`` at scale, one run per algorithm, wall time and peak memory.

Usage (the figures in docs/assignment.md):

    python benchmarks/plan_scale.py --objects /tmp/full_default --queries /tmp/q1m.parquet \
        --workers 12 --out /tmp/plan_bench --report /tmp/plan_bench.json

Each plan runs as its own ``knnmon plan`` process; its peak RSS comes from ``os.wait4`` (it
includes the forked radius workers) and its wall time from the clock around it. Run it on an
otherwise idle machine: the radius step uses both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time


def run(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS in bytes of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return time.perf_counter() - t0, usage.ru_maxrss * 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--algorithms", default="proposed,keyword,space,random")
    p.add_argument("--extra", default="", help="extra knnmon plan flags, e.g. '--handout query'")
    p.add_argument("--out", required=True, help="directory for the plans")
    p.add_argument("--report", required=True, help="JSON report path")
    a = p.parse_args()
    knnmon = os.path.join(os.path.dirname(sys.executable), "knnmon")
    rows = []
    for algo in a.algorithms.split(","):
        out = os.path.join(a.out, algo)
        cmd = [knnmon, "plan", "--objects", a.objects, "--queries", a.queries, "--workers", str(a.workers),
               "--algorithm", algo, "--out", out, *a.extra.split()]
        wall, rss = run(cmd)
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
            s = json.load(fh)
        loads = s["worker_loads"]
        rows.append({"algorithm": algo, "extra": a.extra, "wall_s": round(wall, 1), "peak_rss_gb": round(rss / 2**30, 2),
                     "elapsed_s": s["elapsed_s"], "timings_s": s["timings_s"], "sets": s["sets"],
                     "max_load": max(loads), "mean_load": sum(loads) / len(loads), "imbalance": s["imbalance"],
                     "deliveries_per_object": s["deliveries_per_object"], "queries": s["queries"],
                     "initial_objects": s["initial_objects"], "routing_table_mb": s["routing_table_bytes"] / 1e6})
        print(f"{algo}: {wall:.1f} s, {rss / 2**30:.2f} GB", file=sys.stderr)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    with open(a.report, "w", encoding="utf-8") as fh:
        json.dump({"machine": machine, "workers": a.workers, "rows": rows}, fh, indent=2)
    print("| algorithm | wall s | peak RSS GB | sets | max load | mean load | max/mean | deliveries/object |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = r["algorithm"] + (f" ({r['extra']})" if r["extra"] else "")
        print(f"| {name} | {r['wall_s']} | {r['peak_rss_gb']} | {r['sets']} | {r['max_load']:.2f} | "
              f"{r['mean_load']:.2f} | {r['imbalance']:.3f} | {r['deliveries_per_object']:.2f} |")


if __name__ == "__main__":
    main()
