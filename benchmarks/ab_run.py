"""A/B: the same ``knnmon run`` with this checkout and with another one, alternating, in one sitting.

For a change that should not alter speed (a restructuring), or one that should: both trees run
the same command with the same Python environment, round after round (A B, B A, A B, ...), so that
the shared machine's drift in speed hits both alike. The other tree is a plain checkout (e.g.
``git worktree add /tmp/old <commit>``); it is put on ``PYTHONPATH`` as the ``knnmon`` package
the way ``pyproject.toml`` maps the folders, ahead of this checkout's editable install.

Usage::

    python benchmarks/ab_run.py --other /tmp/old --rounds 2 -- \\
        --objects DIR --queries FILE --workers 1 --set workers.executor=inline --initial 150000

Prints one line per run (objects/s, update time mean and p99, Redis server time per batch) and
writes them as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def overlay(tree: str) -> str:
    """A directory holding ``knnmon`` as ``tree`` installs it (src/knnmon plus the top-level folders)."""
    root = tempfile.mkdtemp(prefix="knnmon-ab-")
    shutil.copytree(os.path.join(tree, "src", "knnmon"), os.path.join(root, "knnmon"))
    for folder in ("ingest", "assignment", "workers", "coordinator"):
        os.symlink(os.path.abspath(os.path.join(tree, folder)), os.path.join(root, "knnmon", folder))
    return root


def run_once(pythonpath: str | None, args: list[str], report: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "knnmon.coordinator.cli", "run", *args, "--quiet", "--report", report]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL)
    with open(report, encoding="utf-8") as fh:
        s = json.load(fh)
    return {"elapsed_s": round(time.perf_counter() - t0, 1), "objects_per_s": round(s["objects_per_s"]),
            "update_ms_mean": round(s["update_ms_mean"], 2), "update_ms_p99": round(s["update_ms_p99"], 2),
            "redis_server_ms_mean": round(s["redis_server_ms_mean"], 2), "results_changed": s["results_changed"],
            "busy_ms_per_batch": [round(b / max(s["batches"], 1), 2) for b in s.get("busy_ms_per_worker") or []],
            "worker_peak_rss_mb": [round(w.get("peak_rss_mb") or 0) for w in s.get("workers_stats") or []],
            "startup_s": s.get("startup_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", required=True, help="the other checkout (B)")
    p.add_argument("--this", help="a checkout to use as A instead of the installed one (so that editing this "
                                  "checkout while the benchmark runs changes nothing)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", help="write the runs as JSON")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then the `knnmon run` flags")
    a = p.parse_args()
    args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    other = overlay(a.other)
    this = overlay(a.this) if a.this else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = (("this", this), ("other", other))
            for name, path in order if r % 2 == 0 else order[::-1]:  # A B, B A, ...: no tree always first
                data = os.path.join(tmp, f"data-{name}{r}")  # each run its own embedded server's data
                row = {"tree": name, "round": r,
                       **run_once(path, [*args, "--set", f"redis.data_dir={data}"], os.path.join(tmp,
                                  f"{name}{r}.json"))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"args": args, "this": a.this, "other": a.other, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
