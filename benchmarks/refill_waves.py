"""Benchmark: refill waves of a windowed run, batch by batch, and two checkouts compared in one sitting.

The places arrive in stream order, a region's places together (one object per ms: ``--initial``
objects fill the window, and from the first batch on the oldest expire, a region at a time). When
a region's places expire, every query there needs its result refilled in the same few batches:
a wave. Each batch logs its update time, the results refilled and the coordinator's refill step
in parts (the store's expiry and the workers' expiry round trip, the refill search, the refilled
regions' routing), and each worker's busy time. The report gives, per checkout, the wall time,
update time p50 / p99 / max, the batches over 1 s and 2 s, and the slowest batches::

    python benchmarks/refill_waves.py --objects /tmp/full --queries /tmp/q100k.parquet \\
        --batches 400 --rev HEAD~3 --rev HEAD --out /tmp/knnmon-bench/refill_waves_100k.json

Each ``--rev`` runs from a frozen copy of that commit (``ab_run.overlay``), in its own process,
one after the other (the shared machine's drift between hours is why both run in one sitting).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_run import overlay  # noqa: E402


def one_run(a: argparse.Namespace) -> None:
    """Stream the batches in this process and write the per-batch log (``--log``)."""
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.runtime import Runtime

    reserve = {"reserve": a.reserve[0]} if a.reserve else {}  # (as the checkout's default when not given)
    config = RunConfig(workers=a.workers, initial=a.initial, batch=a.batch, batches=a.batches, window=a.initial,
                       arrival_ms=1, executor="ray", in_flight=1, **reserve)
    rows = []
    with Runtime(a.objects, a.queries, config) as rt:
        t0 = time.perf_counter()
        for i, batch in enumerate(rt.batches()):
            r = rt.process(batch)
            rows.append({"batch": i, "wall_s": time.perf_counter() - t0, "update_ms": r.update_ms,
                         "refilled": r.refilled, "changed": r.changed, "busy_ms": r.busy_ms,
                         "deliveries": r.deliveries, "candidates": r.candidates,
                         "refill_ms": dict(rt.dispatcher.refill_parts_ms)})
    with open(a.log, "w", encoding="utf-8") as fh:
        json.dump(rows, fh)


def summary(rows: list[dict]) -> dict:
    """The figures of one run's per-batch log (module docstring)."""
    u = np.array([r["update_ms"] for r in rows])
    part = {k: round(sum(r["refill_ms"].get(k, 0.0) for r in rows) / 1e3, 1) for k in ("expire", "search", "routing")}
    top = np.argsort(-u)[:8]
    return {"batches": len(rows), "wall_s": round(rows[-1]["wall_s"], 1),
            "update_ms_p50": round(float(np.percentile(u, 50))), "update_ms_p99": round(float(np.percentile(u, 99))),
            "update_ms_max": round(float(u.max())), "batches_over_1s": int((u > 1000).sum()),
            "batches_over_2s": int((u > 2000).sum()), "refilled": int(sum(r["refilled"] for r in rows)),
            "deliveries": int(sum(r.get("deliveries", 0) for r in rows)),
            "candidates": int(sum(r.get("candidates", 0) for r in rows)),
            "refill_s": part, "slowest": [{"batch": int(i), "update_ms": round(float(u[i])),
                                           "refilled": rows[i]["refilled"],
                                           "search_ms": round(rows[i]["refill_ms"].get("search", 0.0)),
                                           "busiest_worker_ms": round(max(rows[i]["busy_ms"]))} for i in top]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--initial", type=int, default=600_000, help="objects in the window (default 600,000)")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rev", action="append", default=[], help="a commit to run (repeat; default: this checkout)")
    p.add_argument("--reserve", action="append", type=int, default=[],
                   help="neighbours kept beyond k (repeat: each checkout runs with each; default: the checkout's)")
    p.add_argument("--out", help="the JSON report")
    p.add_argument("--log", help=argparse.SUPPRESS)  # one run, in this process
    a = p.parse_args()
    if a.log:
        return one_run(a)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    report = {"command": " ".join(sys.argv), "runs": {}}
    for rev, reserve in [(r, x) for r in a.rev or [None] for x in a.reserve or [None]]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if rev is not None:
            tree = tempfile.mkdtemp(prefix="knnmon-rev-")
            subprocess.run(["git", "-C", root, "worktree", "add", "-q", "--detach", tree, rev], check=True)
            env["PYTHONPATH"] = overlay(tree)
        log = os.path.join(tempfile.mkdtemp(prefix="knnmon-waves-"), "batches.json")
        args = [sys.executable, os.path.abspath(__file__), "--objects", a.objects, "--queries", a.queries, "--initial",
                str(a.initial), "--batch", str(a.batch), "--batches", str(a.batches), "--workers", str(a.workers),
                "--log", log] + ([] if reserve is None else ["--reserve", str(reserve)])
        try:
            subprocess.run(args, check=True, env=env, cwd=tempfile.gettempdir())
        finally:
            if rev is not None:
                subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
        with open(log, encoding="utf-8") as fh:
            rows = json.load(fh)
        name = (rev or "checkout") + ("" if reserve is None else f" reserve {reserve}")
        if name in report["runs"]:  # (a commit run twice, ABBA: each run kept)
            name += f" #{sum(n.split(' #')[0] == name for n in report['runs']) + 1}"
        report["runs"][name] = {"summary": summary(rows), "batches": rows}
        print(name, json.dumps(report["runs"][name]["summary"]), flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
