"""Benchmark: what a lost worker costs `knnmon run`: the time to revive it in place and the update
time of the batch that waited for it, with every result checked on a sample afterwards.

The run streams ``--batches`` batches; before batch ``--kill-at`` it kills worker 1's Ray process
(SIGKILL of its pid), so that batch finds the worker gone, revives it
(:func:`knnmon.coordinator.recovery.revival.revive`) and goes on. Writes a JSON report::

    python benchmarks/worker_loss.py --objects /tmp/full --queries /tmp/q100k.parquet --workers 4 \\
        --initial 1000000 --batches 30 --kill-at 15 --out /tmp/knnmon-bench/worker_loss_run.json

With ``--window`` (and ``--arrival-ms``) the lost worker is rebuilt over the live objects; the
report then has each revival's steps (``revivals``: read, search, repair, load), and with
``--idle-kill-at`` a second worker is killed between two batches and found by the worker list.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time

import numpy as np
import pyarrow as pa

from knnmon.coordinator.bench.oracle_check import mismatches
from knnmon.coordinator.bench.runner import machine_info
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.recovery.reviver import Reviver
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.store import StoreConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--kill-at", type=int, default=15)
    p.add_argument("--check-sample", type=int, default=2000)
    p.add_argument("--window", type=int, help="ms (default: none)")
    p.add_argument("--arrival-ms", type=int)
    p.add_argument("--idle-kill-at", type=int, help="also kill worker 0 after this batch, found between batches")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = RunConfig(workers=a.workers, initial=a.initial, batches=a.batches, in_flight=1 if a.window else 2,
                       window=a.window, arrival_ms=a.arrival_ms, store=StoreConfig(namespace="loss", data_dir=None))
    t0 = time.perf_counter()
    with Runtime(a.objects, a.queries, config, reviver=Reviver) as rt:
        start_s = time.perf_counter() - t0
        rows, revive_s = [], None
        for i, batch in enumerate(rt.batches()):
            if i == a.kill_at:
                victim = rt.registrar.stats()[1]
                os.kill(victim.pid, signal.SIGKILL)
                time.sleep(0.5)  # the process is gone before the batch is sent
            t = time.perf_counter()
            r = rt.process(batch)
            rows.append({"batch": i, "update_ms": r.update_ms, "wall_ms": (time.perf_counter() - t) * 1e3})
            if i == a.kill_at:
                revive_s = rows[-1]["wall_ms"] / 1e3
            if i == a.idle_kill_at:
                os.kill(rt.registrar.stats()[0].pid, signal.SIGKILL)
                time.sleep(0.5)
                rt.worker_processes()  # finds it lost between batches: revived
        assert rt.workers_revived == 1 + (a.idle_kill_at is not None), rt.workers_revived
        q = rt.prepared.queries
        pick = np.sort(np.random.default_rng(0).choice(q.num_rows, min(a.check_sample, q.num_rows), replace=False))
        streamed = pa.concat_tables([rt.prepared.initial, rt.prepared.stream.slice(0, a.batches * config.batch)])
        if a.window:
            t = streamed.column("t").to_numpy()
            streamed = streamed.filter(pa.array(t > rt.window.watermark - a.window))
        bad = mismatches(rt.store.url, "loss", q.take(pa.array(pick)), streamed)
        queries_on_victim = sum(1 for w in rt.registrar.query_worker.values() if w == 1)
    others = [r["update_ms"] for r in rows if r["batch"] != a.kill_at]
    report = {"machine": machine_info(), "args": vars(a), "start_s": round(start_s, 1),
              "queries_on_lost_worker": queries_on_victim,
              "batch_with_loss_s": round(revive_s, 2), "other_batches_update_ms_median": round(float(np.median(others)), 1),
              "checked_queries": len(pick), "mismatched_queries": len(bad),
              "revivals": [{k: round(v, 2) for k, v in s.items()} for s in rt.reviver.seconds], "rows": rows}
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k not in ("rows", "machine")}, indent=1))


if __name__ == "__main__":
    main()
