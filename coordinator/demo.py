"""``knnmon demo``: the whole path on the bundled places sample, with no flags and no setup.

Today it ingests the bundled CC0 SimpleGeo sample (Rhode Island, ~55 k places) on local Spark,
draws a query workload from it, and prints a few queries with their exact kNN, computed by the
brute-force oracle (:class:`knnmon.oracle.BruteForceKnn`). The distributed runtime (Ray workers,
Redis results) will take over the kNN step when it lands.
"""

from __future__ import annotations

import argparse
import os
from importlib import resources
from typing import Any

__all__ = ["add_demo_command", "sample_places_path", "run_demo"]

SAMPLE = "places-sample-ri.geojson.gz"


def sample_places_path() -> str:
    """Path of the bundled places sample (GeoJSON lines, gzip; CC0 SimpleGeo, Rhode Island)."""
    return str(resources.files("knnmon").joinpath("data", SAMPLE))


def run_demo(workdir: str, *, n_queries: int = 1000, k_max: int = 5, show: int = 3, seed: int = 0) -> dict[str, Any]:
    """Ingest the sample into ``workdir``, generate queries, print ``show`` queries' kNN.

    Returns
    -------
    dict
        ``manifest`` (the ingest manifest), ``queries`` (path of the query file), ``shown``
        (list of ``(query row, [(object id, distance m), ...])``).
    """
    from knnmon.ingest.cli import format_manifest
    from knnmon.ingest.jobs import ingest_places
    from knnmon.ingest.queries import QueryWorkload, generate_queries, read_objects, write_queries
    from knnmon.oracle import BruteForceKnn

    objects_dir = os.path.join(workdir, "objects")
    print(f"1/3 ingest the bundled places sample on Spark -> {objects_dir}")
    manifest = ingest_places([sample_places_path()], objects_dir)
    print(format_manifest(manifest))
    objects = read_objects(objects_dir)
    queries_path = os.path.join(workdir, "queries.parquet")
    queries = generate_queries(objects, QueryWorkload(n=n_queries, k_max=k_max, seed=seed))
    write_queries(queries, queries_path)
    print(f"\n2/3 generated {queries.num_rows:,} queries (k in [1, {k_max}]) -> {queries_path}")
    print(f"\n3/3 exact kNN of {show} queries (brute-force oracle over all {objects.num_rows:,} objects):")
    oracle = BruteForceKnn(objects)
    shown = []
    for q in queries.slice(0, show).to_pylist():
        result = oracle.knn(q["lon"], q["lat"], q["keywords"], q["k"])
        shown.append((q, result))
        print(f"\n  {q['id']}: k={q['k']} at ({q['lon']:.5f}, {q['lat']:.5f}) keywords {' '.join(q['keywords'])}")
        for rank, (oid, dist) in enumerate(result, 1):
            print(f"    {rank:>2}. {dist:>10.1f} m  {oid}")
    return {"manifest": manifest, "queries": queries_path, "shown": shown}


def _run(a: argparse.Namespace) -> int:
    run_demo(a.workdir, n_queries=a.queries, k_max=a.kmax, show=a.show, seed=a.seed)
    return 0


def add_demo_command(sub: Any) -> None:
    """Register ``demo`` on a root parser's subparsers."""
    d = sub.add_parser("demo", help="run the whole path on the bundled places sample")
    d.add_argument("--workdir", default="knnmon-out", help="where outputs go (default ./knnmon-out)")
    d.add_argument("--queries", type=int, default=1000, help="number of queries (default 1000)")
    d.add_argument("--kmax", type=int, default=5, help="k of each query is uniform in [1, KMAX] (default 5)")
    d.add_argument("--show", type=int, default=3, help="queries to print with their kNN (default 3)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_run)
