"""``knnmon demo``: the whole path on the bundled places sample, with no flags and no setup.

It ingests the bundled CC0 SimpleGeo sample (Rhode Island, 54,975 places) on local Spark, draws a
query workload from it, starts an embedded Redis and a local Ray instance, loads the first half of
the places as already seen, streams the other half through the workers in batches, and prints a
few queries' kNN as stored in Redis, each checked against the brute-force oracle.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from knnmon.coordinator.cli.options import add_verb, announce_first_compile, DEFAULT_WORKERS

if TYPE_CHECKING:
    from knnmon.coordinator.runtime.metrics import RunSummary
    from knnmon.ingest.output import Manifest

__all__ = ["DemoResult", "add_demo_command", "sample_places_path", "run_demo"]

SAMPLE = "places-sample-ri.geojson.gz"


def sample_places_path() -> str:
    """Path of the bundled places sample (GeoJSON lines, gzip; CC0 SimpleGeo, Rhode Island)."""
    return str(resources.files("knnmon").joinpath("data", SAMPLE))


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` did: the ingest's manifest, the run's summary, and the queries shown,
    each ``(query row, its kNN as stored in Redis, whether it equals the oracle's)``."""

    manifest: Manifest
    summary: RunSummary
    shown: list[tuple[dict, list[dict], bool]]


def run_demo(workdir: str, *, n_queries: int = 2000, k_max: int = 5, workers: int = DEFAULT_WORKERS, show: int = 3, seed: int = 0,
             executor: str = "ray") -> DemoResult:
    """Run the demo in ``workdir`` (module docstring)."""
    from knnmon.coordinator.cli.ingest import format_manifest
    from knnmon.coordinator.cli.results import fetch_result
    from knnmon.coordinator.cli.run import format_run_summary
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.recovery.reviver import Reviver
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.ingest.spark import require_spark
    from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
    from knnmon.ingest.reading import read_objects, stream_order
    from knnmon.oracle import BruteForceKnn
    from knnmon.store import StoreConfig

    require_spark()  # (before anything runs: the demo starts with an ingest)
    from knnmon.ingest.jobs import ingest_places

    objects_dir = os.path.join(workdir, "objects")
    print(f"1/4 ingest the bundled places sample on Spark -> {objects_dir}")
    manifest = ingest_places([sample_places_path()], objects_dir)
    print(format_manifest(manifest))
    objects = read_objects(objects_dir)
    queries_path = os.path.join(workdir, "queries.parquet")
    queries = generate_queries(objects, QueryWorkload(n=n_queries, k_max=k_max, seed=seed))
    write_queries(queries, queries_path)
    print(f"\n2/4 generated {queries.num_rows:,} queries (k in [1, {k_max}]) -> {queries_path}")
    initial = objects.num_rows // 2
    print(f"\n3/4 stream on {workers} workers ({executor}): {initial:,} places seen first, "
          f"{objects.num_rows - initial:,} streamed in batches of 1,000; results to an embedded Redis")
    announce_first_compile()
    data_dir = os.path.join(workdir, "data")
    config = RunConfig(workers=workers, initial=initial, batch=1000, store=StoreConfig(data_dir=data_dir),
                       executor=executor)
    shown = []
    with Runtime(objects_dir, queries_path, config, reviver=Reviver) as rt:
        summary = rt.run(progress=False)
        print(format_run_summary(summary))
        oracle = BruteForceKnn(stream_order(objects, None))
        namespace = config.store.namespace
        print(f"\n4/4 {show} queries' kNN as stored in Redis (ZRANGE {namespace}:result:<qid> 0 -1 WITHSCORES):")
        for q in queries.slice(0, show).to_pylist():
            r = fetch_result(rt.store.url, namespace, q["id"])
            want = oracle.knn(q["lon"], q["lat"], q["keywords"], q["k"])
            exact = [o["id"] for o in r["knn"]] == [w[0] for w in want]
            shown.append((q, r["knn"], exact))
            print(f"\n  {q['id']}: k={q['k']} at ({q['lon']:.5f}, {q['lat']:.5f}) keywords {' '.join(q['keywords'])}"
                  f"  [{'equals' if exact else 'DIFFERS FROM'} the brute-force kNN]")
            for rank, o in enumerate(r["knn"], 1):
                print(f"    {rank:>2}. {o['distance_m']:>10.1f} m  {o['id']}  {' '.join(o['keywords'])}")
    print(f"\nRead any result later with: knnmon results <qid> --data-dir {data_dir}")
    return DemoResult(manifest, summary, shown)


def _run(a: argparse.Namespace) -> int:
    result = run_demo(a.workdir, n_queries=a.queries, k_max=a.kmax, workers=a.workers, show=a.show, seed=a.seed)
    ok = all(exact for _, _, exact in result.shown)
    if a.dashboard:
        from knnmon.coordinator.cli.dashboard import dashboard_on
        from knnmon.store import StoreConfig

        first = result.shown[0][0]["id"] if result.shown else ""
        print(f"\nThe dashboard shows these queries on a map; try the search box with {first}.")
        dashboard_on(StoreConfig(data_dir=os.path.join(a.workdir, "data")), a.http)
    return 0 if ok else 1


def add_demo_command(sub: Any) -> None:
    """Register ``demo`` on a root parser's subparsers."""
    d = add_verb(sub, "demo", "run the whole path on the bundled places sample")
    d.add_argument("--workdir", default="knnmon-out", help="where outputs go (default ./knnmon-out)")
    d.add_argument("--queries", type=int, default=2000, help="number of queries (default 2000)")
    d.add_argument("--kmax", type=int, default=5, help="k of each query is uniform in [1, KMAX] (default 5)")
    d.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"workers (default {DEFAULT_WORKERS})")
    d.add_argument("--show", type=int, default=3, help="queries to print with their kNN (default 3)")
    d.add_argument("--seed", type=int, default=0, help="query workload seed")
    d.add_argument("--dashboard", action="store_true",
                   help="then serve `knnmon dashboard` on the demo's results (prints its URL; Ctrl-C stops it)")
    d.add_argument("--http", default="127.0.0.1:8765", metavar="HOST:PORT",
                   help="with --dashboard: where it is served (default 127.0.0.1:8765)")
    d.set_defaults(func=_run)
