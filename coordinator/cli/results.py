"""``knnmon results QID``: a query's current kNN, with each object's details, from Redis."""

from __future__ import annotations

import argparse
import json
from typing import Any

from knnmon.connection import connect
from knnmon.coordinator.cli.options import add_verb, add_store_options, store_config
from knnmon.errors import KnnmonError
from knnmon.keys import Keys
from knnmon.results import ResultReader
from knnmon.store import open_store

__all__ = ["add_results_command", "fetch_result"]


def fetch_result(url: str, namespace: str, qid: str) -> dict[str, Any]:
    """A query's current kNN from Redis, with its parameters and each object's details, typed
    (:meth:`ResultReader.read <knnmon.results.ResultReader.read>`).

    Returns
    -------
    dict
        ``query``: ``{"id", "lon", "lat" (degrees), "keywords" (list), "k", "worker"}``;
        ``knn``: ``[{"id", "distance_m", "lon", "lat", "t" (epoch ms), "keywords"}, ...]``
        nearest first.

    Raises
    ------
    KnnmonError
        No such query in the namespace.
    """
    keys = Keys(namespace)
    client = connect(url)
    try:
        stored = ResultReader(client, keys, url=url).read(qid)
    finally:
        client.close()
    if stored is None:
        raise KnnmonError(f"no query {qid!r} in namespace {keys.namespace!r}")
    return {"query": stored.query.as_dict(),
            "knn": [{"id": n.id, "distance_m": n.distance_m, "lon": n.lon, "lat": n.lat, "t": n.t,
                     "keywords": n.keywords or []} for n in stored.knn]}


def _results(a: argparse.Namespace) -> int:
    config = store_config(a)
    with open_store(config, existing=True) as store:
        r = fetch_result(store.url, config.namespace, a.qid)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    q = r["query"]
    print(f"query {a.qid}: k={q['k']} at ({q['lon']}, {q['lat']}), keywords {' '.join(q['keywords'])}, "
          f"worker {q['worker']}")
    for rank, o in enumerate(r["knn"], 1):
        print(f"  {rank:>2}. {o['distance_m']:>12.1f} m  {o['id']}  ({o['lon']}, {o['lat']})  {' '.join(o['keywords'])}")
    if not r["knn"]:
        print("  (no matching object yet)")
    return 0


def add_results_command(sub: Any) -> None:
    """Register ``results`` on a root parser's subparsers."""
    q = add_verb(sub, "results", "print a query's current kNN from Redis")
    q.add_argument("qid", metavar="QID", help="the query's id")
    q.add_argument("--json", action="store_true", help="print JSON")
    add_store_options(q)
    q.set_defaults(func=_results)
