"""The workers' two query indexes on the same stream, in one sitting: ``--index grid`` vs ``rtree``.

For each worker count, ``knnmon run`` streams the same batches with each index, in the order
A B B A (so that the machine's drift shows as a difference between a setting's two runs), and
the summaries are collected: throughput, update time per batch (every object of a batch gets
its result when the batch is done: its response time), candidates per changed result. W = 1
runs one inline worker (no Ray), larger W Ray actors.

    python benchmarks/index_compare.py --objects /tmp/full_default --queries /tmp/q100k.parquet \\
        --workers 1,4 --batches 60 --report /tmp/knnmon-bench/index_compare.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from knnmon.coordinator.bench.speed_probe import speed_probe_ms

KEEP = ("objects_per_s", "update_ms_mean", "update_ms_p50", "update_ms_p99", "candidates", "results_changed",
        "candidates_per_change", "deliveries_per_object", "wall_s")


def run(a, index: str, workers: int, tmp: Path) -> dict:
    report = tmp / f"{index}_{workers}.json"
    cmd = [sys.executable, "-m", "knnmon.coordinator.cli", "run", "--objects", a.objects, "--queries", a.queries,
           "--workers", str(workers), "--initial", str(a.initial), "--batches", str(a.batches), "--index", index,
           "--quiet", "--report", str(report), "--data-dir", str(tmp / "data")]
    if a.shuffle is not None:
        cmd += ["--shuffle", str(a.shuffle)]
    if workers == 1:
        cmd += ["--executor", "inline"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = json.loads(report.read_text())
    row = {"index": index, "workers": workers, **{k: s.get(k) for k in KEEP}}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--workers", default="1,4")
    ap.add_argument("--initial", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--shuffle", type=int, default=1, help="stream in a seeded random order (default 1)")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    rows = []
    probe = speed_probe_ms()
    with tempfile.TemporaryDirectory() as d:
        for w in (int(x) for x in a.workers.split(",")):
            for index in ("grid", "rtree", "rtree", "grid"):
                rows.append(run(a, index, w, Path(d)))
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "command": " ".join(sys.argv), "config": vars(a), "probe_ms_before": probe,
              "probe_ms_after": speed_probe_ms(), "rows": rows}
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
