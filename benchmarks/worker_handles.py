"""Benchmark: a windowed worker's object handles (and their ids and details) over a stream, and
what their compaction costs, for one or more values of ``HANDLES_SLACK``, in one sitting.

One worker in this process (``--executor inline``) holds ``--queries-n`` queries over a window of
``--initial`` places (one per ms, in stream order), then streams ``--batches`` batches of 1,000.
Every 30 batches it records the handles held, the bytes of their ids and details, and the
process's RSS (the coordinator's included); every compaction is timed::

    python benchmarks/worker_handles.py --objects /tmp/full --queries /tmp/q100k.parquet \\
        --slack 4 --slack 1.25 --out /tmp/knnmon-bench/worker_handles.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time


def one_run(a: argparse.Namespace, slack: float) -> dict:
    import pyarrow.parquet as pq

    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.heap import resident_bytes
    from knnmon.workers import state as worker_state

    worker_state.HANDLES_SLACK = slack
    with tempfile.TemporaryDirectory() as tmp:
        queries = f"{tmp}/queries.parquet"
        pq.write_table(pq.read_table(a.queries).slice(0, a.queries_n), queries)
        config = RunConfig(workers=1, initial=a.initial, batch=1000, batches=a.batches, window=a.initial,
                           arrival_ms=1, executor="inline", in_flight=1)
        rows, compactions = [], []
        with Runtime(a.objects, queries, config) as rt:
            w = rt.pool.workers[0]
            compact = w.state.compact_handles

            def timed() -> None:
                t = time.perf_counter()
                compact()
                compactions.append(round((time.perf_counter() - t) * 1e3, 1))

            w.state.compact_handles = timed
            t0 = time.perf_counter()
            for i, batch in enumerate(rt.batches()):
                rt.process(batch)
                if i % 30 == 0:
                    handles = w.state.handles
                    rows.append({"batch": i, "handles": len(handles), "kept_at_last_compaction": int(handles.live),
                                 "details_mb": round(w.state.details._texts.nbytes / 2**20, 1),
                                 "ids_mb": round(w.state.handles.ids.nbytes / 2**20, 1),
                                 "rss_mb": round(resident_bytes() / 2**20)})
            wall = time.perf_counter() - t0
    return {"slack": slack, "wall_s": round(wall, 1), "compactions_ms": compactions, "samples": rows,
            "details_mb_max": max(r["details_mb"] for r in rows), "handles_max": max(r["handles"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--queries-n", type=int, default=25_000, help="queries of the worker (4 workers at 100,000)")
    p.add_argument("--initial", type=int, default=600_000)
    p.add_argument("--batches", type=int, default=900)
    p.add_argument("--slack", action="append", type=float, default=[], help="HANDLES_SLACK to run (repeat)")
    p.add_argument("--out")
    p.add_argument("--one", type=float, help=argparse.SUPPRESS)  # one run, in this process
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one_run(a, a.one)))
        return
    runs = []
    for slack in a.slack or [1.25]:  # each in its own process: nothing carried over
        args = [sys.executable, __file__, "--objects", a.objects, "--queries", a.queries, "--queries-n",
                str(a.queries_n), "--initial", str(a.initial), "--batches", str(a.batches), "--one", str(slack)]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"slack {slack}: wall {r['wall_s']} s, {len(r['compactions_ms'])} compactions "
              f"{r['compactions_ms'][:12]} ms, handles max {r['handles_max']:,}, details max {r['details_mb_max']} MB",
              flush=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a), "runs": runs}
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
