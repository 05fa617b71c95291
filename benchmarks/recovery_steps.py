"""Benchmark: a service's restart over a copy of a Redis data directory, step by step.

Copies the data directory of a durable embedded Redis (e.g. a chaos soak's ``--log-dir``'s
``redis``), starts a Redis on the copy, times the parse of the objects stream's first
``--parse`` entries (``parse_object``, the per-entry path recovery takes), then starts
``knnmon serve`` over it (local Ray) and reports the recovery's logged steps (objects stream,
query hashes, search, reconcile, the runtime started: plan and load); with ``--starts 2`` it
kills that service after its recovery and starts again, which then resumes from the stored
results (``coordinator/recovery/resume.py``)::

    python benchmarks/recovery_steps.py --redis-dir /tmp/chaos5/redis --namespace chaos \\
        --workers 4 --window 10m --out /tmp/knnmon-bench/recovery_steps.json

The copy and the service's files go under ``--work-dir`` (removed first).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def parse_seconds(url: str, key: str, n: int) -> dict:
    """Seconds to read and to parse the first ``n`` entries of the stream ``key``."""
    from knnmon.connection import connect
    from knnmon.errors import Rejected
    from knnmon.limits import DEFAULT_LIMITS
    from knnmon.protocol import parse_object

    client = connect(url)
    t0 = time.perf_counter()
    entries = client.xrange(key, min="-", max="+", count=n)
    t1 = time.perf_counter()
    parsed = 0
    for eid, fields in entries:
        try:
            parse_object(eid, fields, DEFAULT_LIMITS, clock_ms=None)
            parsed += 1
        except Rejected:
            pass
    client.close()
    return {"entries": len(entries), "parsed": parsed, "read_s": round(t1 - t0, 2),
            "parse_s": round(time.perf_counter() - t1, 2)}


def _start(a, work: Path, url: str, start: int) -> dict:
    """Start ``knnmon serve`` over the copy, wait for its recovery's log line, stop it (SIGKILL
    after the first start when more follow, so that the next one restarts from a crash); its
    logged steps."""
    log_path = work / f"serve-{start}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", url, "--namespace",
             a.namespace, "--workers", str(a.workers), "--window", a.window, "--data-dir", str(work / "data")],
            stdout=log, stderr=subprocess.STDOUT)
        line, t0 = None, time.monotonic()
        try:
            while line is None and service.poll() is None and time.monotonic() - t0 < a.timeout_s:
                time.sleep(1)
                line = next((x for x in log_path.read_text().splitlines()
                             if re.search(r"recovered [1-9]\d* queries", x)), None)
        finally:
            service.kill() if start + 1 < a.starts else service.terminate()
            service.wait(timeout=120)
    report: dict = {"recovery_log": line}
    if line:
        m = re.search(r"in ([\d.]+) s: (.*), the rest ([\d.]+) s \(the runtime: (.*?);", line)
        steps = dict((k, float(v)) for k, v in re.findall(r"(\w+) ([\d.]+) s", m.group(2))) if m else {}
        parts = dict((f"runtime_{k}", float(v)) for k, v in re.findall(r"(\w+) ([\d.]+) s", m.group(4))) if m else {}
        report["recovery_s"] = {"total": float(m.group(1)), **steps, "rest": float(m.group(3)), **parts} if m else None
        placed = re.search(r"(\d+) placements rewritten", line)
        report["placements_rewritten"] = int(placed.group(1)) if placed else None
        report["from_stored_results"] = "from the stored results" in line
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-dir", required=True, help="a durable embedded Redis's data directory (copied)")
    p.add_argument("--namespace", default="knn")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--window", default="10m")
    p.add_argument("--parse", type=int, default=200_000, help="objects stream entries to time the parse of")
    p.add_argument("--work-dir", default="/tmp/knnmon-recovery-steps")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--starts", type=int, default=1,
                   help="starts in a row over the copy: the first recovers in full and records the settings, the "
                        "next ones (after a SIGKILL) start the workers from the stored results")
    p.add_argument("--out", help="the JSON report")
    a = p.parse_args()

    from knnmon.keys import Keys
    from knnmon.redis_server import EmbeddedRedis, free_port

    work = Path(a.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(a.redis_dir, work / "redis", ignore=shutil.ignore_patterns("server.pid"))
    redis = EmbeddedRedis(str(work / "redis"), port=free_port(), durable=True).start()
    report: dict = {"args": vars(a), "date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        report["parse"] = parse_seconds(redis.url, Keys(a.namespace).ingest_objects, a.parse)
        for start in range(a.starts):
            report[f"start_{start}"] = _start(a, work, redis.url, start)
    finally:
        redis.stop()
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
