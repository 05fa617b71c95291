"""Benchmark: re-balancing under a drift built from two states' places (issue 36).

The plan is made from one region and a mix of a second; then only the second arrives. The
places of ``--first`` and a random ``--mix`` share of ``--second`` are the initial objects (the
load model's statistics come from them alone: they are ingested together); the rest of
``--second``, shuffled, is the stream, ``--batches`` batches of ``--batch``. ``--queries`` queries
are drawn from the initial objects. Each run plans with the proposed assignment on ``--workers``
Ray workers and streams one batch at a time; runs without re-balancing and with it, by its
trigger (``window``, ``smoothed``), go in the order ``--order`` (ABBA: the shared machine's speed
drifts), over the same prepared kNN::

    python benchmarks/rebalance_drift.py --first ../shared/data/places/places-us-ia.geojson.gz \\
        --second ../shared/data/places/places-us-ks.geojson.gz --queries 20000 --workers 4 \\
        --work /tmp/drift --out /tmp/knnmon-bench/rebalance_drift_w4.json

Each row is :func:`knnmon.coordinator.bench.runner._one_run`'s (``update_ms_sim_mean``: the
slowest worker's busy time per batch, mean; ``slowest_over_mean_busy`` over the run; each
re-plan's record), plus the same over the batches after the first re-plan. The report's
``summary`` gives each setting's means.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa


def _lines(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [x for x in fh.read().splitlines() if x.strip()]


def build(a: argparse.Namespace) -> tuple[str, pa.Table, pa.Table]:
    """Ingest the initial places and the stream's (once per ``--work``); returns the initial
    ingest directory and the two tables, the stream's times after every initial one's."""
    from knnmon.ingest.jobs import ingest_places
    from knnmon.ingest.reading import read_objects

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    key = f"{Path(a.first).name}+{a.mix}x{Path(a.second).name}-{a.seed}"
    initial_dir, stream_dir = work / f"initial-{key}", work / f"stream-{key}"
    if not (initial_dir / "manifest.json").exists() or not (stream_dir / "manifest.json").exists():
        second = _lines(a.second)
        order = np.random.default_rng(a.seed).permutation(len(second))
        n_mix = int(a.mix * len(second))
        (work / "initial.geojson").write_text("\n".join(_lines(a.first) + [second[i] for i in order[:n_mix]]) + "\n")
        (work / "stream.geojson").write_text("\n".join(second[i] for i in order[n_mix:]) + "\n")
        ingest_places([str(work / "initial.geojson")], str(initial_dir))
        ingest_places([str(work / "stream.geojson")], str(stream_dir))
    rng = np.random.default_rng(a.seed + 1)
    initial, stream = read_objects(str(initial_dir)), read_objects(str(stream_dir))
    initial = initial.take(pa.array(rng.permutation(initial.num_rows)))
    stream = stream.take(pa.array(rng.permutation(stream.num_rows)))
    t0 = int(time.time() * 1000) - initial.num_rows - stream.num_rows - 60_000
    at = t0 + np.arange(initial.num_rows + stream.num_rows, dtype=np.int64)
    initial = initial.set_column(initial.column_names.index("t"), "t", pa.array(at[:initial.num_rows]))
    stream = stream.set_column(stream.column_names.index("t"), "t", pa.array(at[initial.num_rows:]))
    return str(initial_dir), initial, stream


def after_first_replan(row: dict) -> dict:
    """Slowest / mean busy and the slowest worker's busy time per batch over the batches after
    the run's first re-plan (all batches without one)."""
    busy = np.asarray(row["busy_ms_per_batch"], dtype=np.float64)
    first = min((r["batch"] for r in row["replan_records"]), default=-1)
    tail = busy[first + 1:] if len(busy) > first + 1 else busy
    total = tail.sum(axis=0)
    return {"from_batch": first + 1, "slowest_over_mean_busy": float(total.max() / total.mean()),
            "update_ms_sim_mean": float(tail.max(axis=1).mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first", required=True, help="the first region's places (GeoJSON lines, .gz)")
    ap.add_argument("--second", required=True,
                    help="the second region's places: a --mix share initial, the rest streamed")
    ap.add_argument("--mix", type=float, default=0.1)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--order", default="off,window,smoothed,smoothed,window,off",
                    help="runs without re-balancing (off) and with it, by its trigger (window, smoothed), in order")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/knnmon-drift", help="where the two ingests are kept")
    ap.add_argument("--out", help="the JSON report")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from knnmon.assignment import LoadModel
    from knnmon.coordinator.bench.runner import BenchConfig, _one_run, machine_info
    from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig
    from knnmon.coordinator.runtime.preparation import prepare_tables
    from knnmon.coordinator.runtime.ray_start import init_ray
    from knnmon.ingest.queries import QueryWorkload, generate_queries
    from knnmon.store import StoreConfig, open_store

    initial_dir, initial, stream = build(a)
    queries = generate_queries(initial, QueryWorkload(n=a.queries, k_max=10, seed=a.seed))
    prepared = prepare_tables(LoadModel.from_ingest(initial_dir), queries, initial,
                              stream.slice(0, a.batches * a.batch))
    cfg = BenchConfig(objects=initial_dir, queries=(a.queries,), workers=(a.workers,), algorithms=("proposed",),
                      initial=initial.num_rows, batch=a.batch, batches=a.batches, seed=a.seed)
    out = {"machine": machine_info(), "config": vars(a), "initial_objects": initial.num_rows,
           "stream_objects": prepared.stream.num_rows, "rows": []}
    print(f"{initial.num_rows:,} initial objects, {prepared.stream.num_rows:,} streamed, {a.queries:,} queries",
          flush=True)
    with open_store(StoreConfig(url=None, namespace=cfg.namespace, data_dir=None)) as store:
        init_ray(None)
        for i, setting in enumerate(a.order.split(",")):
            run_cfg = cfg if setting == "off" else replace(
                cfg, rebalance_config=RebalanceConfig(trigger=setting))
            row = _one_run(run_cfg, prepared, None, "proposed", a.workers, 10, i, store.url, False,
                           rebalance=setting != "off")
            row["setting"] = setting
            row["after_first_replan"] = after_first_replan(row)
            out["rows"].append(row)
            print(f"rebalance {setting:8s}: sim update {row['update_ms_sim_mean']:.1f} ms, slowest/mean "
                  f"{row['slowest_over_mean_busy']:.2f}, {row['objects_per_s']:,.0f} objects/s, "
                  f"{row['replans']} re-plans moved {row['queries_moved']:,} queries "
                  f"({[r['seconds'] for r in row['replan_records']]} s)", flush=True)
            if a.out:
                Path(a.out).write_text(json.dumps(out, indent=1))
    by = {s: [r for r in out["rows"] if r["setting"] == s] for s in dict.fromkeys(a.order.split(","))}
    out["summary"] = {s: {k: float(np.mean([r[k] for r in rows])) for k in
                          ("update_ms_sim_mean", "slowest_over_mean_busy", "objects_per_s", "queries_moved")}
                      for s, rows in by.items() if rows}
    print(json.dumps(out["summary"], indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
