"""``knnmon results QID``: a query's current kNN, with each object's details, from Redis."""

from __future__ import annotations

import argparse
import json
from typing import Any

from knnmon.batch import ObjectInfo
from knnmon.connection import connect, with_retries
from knnmon.coordinator.cli.options import add_verb, add_store_options, store_config
from knnmon.errors import KnnmonError
from knnmon.keys import Keys
from knnmon.store import open_store

__all__ = ["add_results_command", "fetch_result", "query_hash", "typed_query"]


def query_hash(client, keys: Keys, qid: str) -> dict[str, str]:
    """The query hash of ``qid`` (``client``: string replies).

    Raises
    ------
    KnnmonError
        No such query in the namespace.
    """
    h = client.hgetall(keys.query(qid))
    if not h:
        raise KnnmonError(f"no query {qid!r} in namespace {keys.namespace!r}")
    return h


def fetch_result(url: str, namespace: str, qid: str) -> dict[str, Any]:
    """A query's current kNN from Redis, with its parameters and each object's details, typed.

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

    def read() -> dict[str, Any]:
        query = query_hash(client, keys, qid)
        knn = client.zrange(keys.result(qid), 0, -1, withscores=True)
        where = query.get("objects", "")  # (no `objects` field before 2026-11-23)
        if not where.startswith(keys.objects("")):  # only ever a details hash of this namespace
            where = keys.objects(query.get("worker", ""))
        details = client.hmget(where, [oid for oid, _ in knn]) if knn else []
        return {"query": typed_query(qid, query),
                "knn": [{"id": oid, "distance_m": dist, **_typed_object(info)} for (oid, dist), info in zip(knn, details)]}

    try:
        return with_retries(read, f"reading the result of {qid}", url)
    finally:
        client.close()


def _number(text: str | None, kind: type) -> Any:
    try:
        return kind(text) if text is not None else None
    except ValueError:
        return None


def typed_query(qid: str, h: dict[str, str]) -> dict[str, Any]:
    """A query hash's fields typed: ``id``, ``lon``, ``lat`` (float degrees), ``keywords``
    (list), ``k``, ``worker`` (int); ``None`` where missing or malformed."""
    return {"id": qid, "lon": _number(h.get("lon"), float), "lat": _number(h.get("lat"), float),
            "keywords": h.get("keywords", "").split(), "k": _number(h.get("k"), int),
            "worker": _number(h.get("worker"), int)}


def _typed_object(value: str | None) -> dict[str, Any]:
    try:
        o = ObjectInfo.from_text(value or "")
    except ValueError:
        return {"lon": None, "lat": None, "t": None, "keywords": []}
    return {"lon": o.lon, "lat": o.lat, "t": o.t, "keywords": list(o.keywords)}


def _results(a: argparse.Namespace) -> int:
    with open_store(store_config(a), existing=True) as store:
        r = fetch_result(store.url, a.namespace, a.qid)
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
