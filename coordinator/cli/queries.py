"""``knnmon queries generate``: the paper's query workload drawn from an ingest output."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.coordinator.cli.options import add_verb

__all__ = ["add_queries_commands"]


def _run_generate(a: argparse.Namespace) -> int:
    from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
    from knnmon.ingest.reading import read_objects

    workload = QueryWorkload(n=a.n, k_max=a.kmax, seed=a.seed)
    queries = generate_queries(read_objects(a.objects, ["id", "lon", "lat", "keywords"]), workload)
    write_queries(queries, a.out)
    print(f"wrote {queries.num_rows:,} queries (k in [1, {a.kmax}], seed {a.seed}) to {a.out}")
    return 0


def add_queries_commands(sub: Any) -> None:
    """Register ``queries generate`` on a root parser's subparsers."""
    q = add_verb(sub, "queries", "query workloads")
    qs = q.add_subparsers(dest="action", required=True, metavar="{generate}")
    g = add_verb(qs, "generate", "the paper's workload: random objects' locations and 1-3 of their keywords")
    g.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    g.add_argument("--n", type=int, required=True, help="number of queries")
    g.add_argument("--kmax", type=int, required=True, help="k of each query is uniform in [1, KMAX]")
    g.add_argument("--seed", type=int, default=0, help="random seed (the same seed gives the same workload)")
    g.add_argument("--out", required=True, metavar="FILE.parquet", help="the query file to write")
    g.set_defaults(func=_run_generate)
