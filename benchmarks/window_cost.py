"""What a window costs: the same ``knnmon run`` with and without ``--window``, alternating, in one sitting.

Issue 17's target: objects/s with a window holding ~500 k objects within 25 % of the same run
without one (all places, 1 M initial, 100 k queries, shuffled). The stream's times are arrival
times (``run.arrival_ms = 1``: one object per ms), so ``--window 500s`` holds 500 k objects. Runs go
W N, N W, ... so the shared machine's drift hits both alike; each runs from a frozen copy of this
checkout (``ab_run.overlay``), so editing the checkout meanwhile changes nothing.

Usage::

    python benchmarks/window_cost.py --window 500s --rounds 2 --out /tmp/knnmon-bench/window_cost.json -- \\
        --objects /tmp/full --queries /tmp/q100k.parquet --set run.shuffle=1 --set run.arrival_ms=1 \\
        --set run.batches=150
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_run import overlay  # noqa: E402

FIELDS = ("objects_per_s", "update_ms_mean", "update_ms_p99", "redis_server_ms_mean", "results_changed",
          "deliveries_per_object", "candidates", "late_ignored", "results_refilled", "refill_ms_mean",
          "refill_ms_per_result", "initial_objects", "objects")


def run_once(pythonpath: str, args: list[str], report: str) -> dict:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, "-m", "knnmon.coordinator.cli", "run", *args, "--quiet", "--report", report]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL)
    with open(report, encoding="utf-8") as fh:
        s = json.load(fh)
    peak = [round(w["peak_rss_mb"]) for w in s.get("workers_stats", [])]
    return {"elapsed_s": round(time.perf_counter() - t0, 1), **{f: s.get(f) for f in FIELDS},
            "worker_peak_rss_mb": peak, "startup_s": s.get("startup_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", required=True, help="the window of the windowed runs (e.g. 500s)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", help="write the runs as JSON")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then the `knnmon run` flags")
    a = p.parse_args()
    args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    tree = overlay(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = (("window", ["--window", a.window]), ("none", []))
            for name, extra in order if r % 2 == 0 else order[::-1]:
                data = os.path.join(tmp, f"data-{name}{r}")
                row = {"run": name, "round": r,
                       **run_once(tree, [*args, *extra, "--set", f"redis.data_dir={data}"], os.path.join(tmp,
                                  f"{name}{r}.json"))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"args": args, "window": a.window, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
