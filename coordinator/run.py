"""``knnmon run`` (stream a data set through the distributed runtime) and ``knnmon results``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.assignment.costs import COST_MODELS
from knnmon.connection import connect, redis_url_from_env, with_retries
from knnmon.coordinator.plan import add_routing_entries_argument
from knnmon.coordinator.runtime import RunConfig, Runtime
from knnmon.errors import KnnmonError
from knnmon.keys import DEFAULT_NAMESPACE, Keys
from knnmon.redis_server import EmbeddedRedis

__all__ = ["add_run_commands", "add_store_arguments", "fetch_result", "format_run_summary", "redis_for_reading"]


def format_run_summary(s: dict[str, Any]) -> str:
    """The run summary as a few readable lines."""
    return "\n".join([
        f"{s['algorithm']} on {s['workers']} workers: {s['queries']:,} queries, {s['initial_objects']:,} initial objects, "
        f"{s['objects']:,} streamed in {s['batches']} batches ({s['duplicates_ignored']} duplicate ids ignored)",
        f"throughput {s['objects_per_s']:,.0f} objects/s end to end ({s['wall_s']:.1f} s)",
        f"update time per batch: mean {s['update_ms_mean']:.1f} ms, p50 {s['update_ms_p50']:.1f} ms, "
        f"p99 {s['update_ms_p99']:.1f} ms; load imbalance (busiest - idlest worker) {s['imbalance_ms_mean']:.1f} ms",
        f"deliveries per object {s['deliveries_per_object']:.2f}; results changed {s['results_changed']:,}; "
        f"candidate pairs checked {s['candidates']:,}"
        + (f" ({s['candidates_per_change']:.1f} per change)" if s["candidates_per_change"] else ""),
        f"Redis server time per batch (result scripts, serial): mean {s['redis_server_ms_mean']:.1f} ms, "
        f"p99 {s['redis_server_ms_p99']:.1f} ms",
        f"results in Redis at {s['redis_url']} (namespace {s['config']['namespace']!r})",
    ])


def _run(a: argparse.Namespace) -> int:
    config = RunConfig(workers=a.workers, algorithm=a.algorithm, initial=a.initial, batch=a.batch, batches=a.batches,
                       shuffle=a.shuffle, redis_url=a.redis, data_dir=a.data_dir, namespace=a.namespace,
                       ray_address=a.ray_address, executor=a.executor, cost_model=a.cost_model, in_flight=a.in_flight,
                       routing_entries=a.routing_entries, overlap_writes=not a.sync_writes)
    embedded = redis_url_from_env(a.redis) is None
    with Runtime(a.objects, a.queries, config) as rt:
        summary = rt.run(progress=not a.quiet)
    if embedded:
        summary["redis_url"] = f"the embedded server, saved in {os.path.join(a.data_dir, 'redis')} (read it with `knnmon results QID`)"
    print(format_run_summary(summary))
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    return 0


@contextlib.contextmanager
def redis_for_reading(url: str | None, data_dir: str) -> Iterator[str]:
    """A Redis URL to read results from: ``url`` / ``$KNNMON_REDIS_URL``, else the embedded store
    of ``data_dir`` (started for the duration).

    Raises
    ------
    KnnmonError
        No URL and no embedded store in ``data_dir``.
    """
    url = redis_url_from_env(url)
    if url:
        yield url
        return
    store = os.path.join(data_dir, "redis")
    if not os.path.exists(os.path.join(store, "knnmon.rdb")):
        raise KnnmonError(f"no results store: give --redis URL, or run `knnmon run` first (looked in {store})")
    with EmbeddedRedis(store) as server:
        yield server.url


def fetch_result(url: str, namespace: str, qid: str) -> dict[str, Any]:
    """A query's current kNN from Redis, with its details and each object's.

    Returns
    -------
    dict
        ``query`` (the query hash), ``knn``: ``[{"id", "distance_m", "lon", "lat", "t",
        "keywords"}, ...]`` nearest first.

    Raises
    ------
    KnnmonError
        No such query in the namespace.
    """
    keys = Keys(namespace)
    client = connect(url)

    def read() -> dict[str, Any]:
        query = client.hgetall(keys.query(qid))
        if not query:
            raise KnnmonError(f"no query {qid!r} in namespace {namespace!r} at {url}")
        knn = client.zrange(keys.result(qid), 0, -1, withscores=True)
        pipe = client.pipeline(transaction=False)
        for oid, _ in knn:
            pipe.hgetall(keys.object(oid))
        details = pipe.execute()
        return {"query": query, "knn": [{"id": oid, "distance_m": dist, **info} for (oid, dist), info in zip(knn, details)]}

    try:
        return with_retries(read, f"reading the result of {qid}", url)
    finally:
        client.close()


def _results(a: argparse.Namespace) -> int:
    with redis_for_reading(a.redis, a.data_dir) as url:
        r = fetch_result(url, a.namespace, a.qid)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    q = r["query"]
    print(f"query {a.qid}: k={q.get('k')} at ({q.get('lon')}, {q.get('lat')}), keywords {q.get('keywords')}, "
          f"worker {q.get('worker')}, version {q.get('version')}")
    for rank, o in enumerate(r["knn"], 1):
        print(f"  {rank:>2}. {o['distance_m']:>12.1f} m  {o['id']}  ({o.get('lon')}, {o.get('lat')})  {o.get('keywords', '')}")
    if not r["knn"]:
        print("  (no matching object yet)")
    return 0


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    """``--redis``, ``--namespace``, ``--data-dir``: where results live."""
    p.add_argument("--redis", metavar="URL", help="Redis URL (default $KNNMON_REDIS_URL, else the embedded server)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=f"Redis key prefix (default {DEFAULT_NAMESPACE})")
    p.add_argument("--data-dir", default="knnmon-data", help="where the embedded Redis keeps its data (default ./knnmon-data)")


def add_run_commands(sub: Any) -> None:
    """Register ``run`` and ``results`` on a root parser's subparsers."""
    r = sub.add_parser("run", help="stream objects through the distributed runtime; results go to Redis")
    r.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    r.add_argument("--queries", required=True, metavar="FILE", help="a query file")
    r.add_argument("--workers", type=int, default=4, metavar="W")
    r.add_argument("--algorithm", default="proposed", choices=sorted(ALGORITHMS))
    r.add_argument("--initial", type=int, default=1_000_000, metavar="N", help="objects seen before the stream")
    r.add_argument("--batch", type=int, default=1000, metavar="B", help="objects per batch (default 1000)")
    r.add_argument("--batches", type=int, metavar="M", help="stop after M batches (default: all objects)")
    r.add_argument("--shuffle", type=int, metavar="SEED", help="stream in random order instead of (t, id)")
    r.add_argument("--cost-model", choices=COST_MODELS, default="measured",
                   help="what the plan balances (default measured; docs/assignment.md)")
    r.add_argument("--ray-address", metavar="ADDR", help="join a Ray cluster (default: a local Ray instance)")
    r.add_argument("--executor", choices=("ray", "inline"), default="ray", help="workers as Ray actors (default) or in process")
    r.add_argument("--in-flight", type=int, default=2, metavar="N",
                   help="batches dispatched before the oldest is waited for (default 2; 1 = one at a time)")
    r.add_argument("--sync-writes", action="store_true",
                   help="each worker waits for a batch's Redis write before its next batch (default: it computes "
                        "the next batch while Redis writes)")
    add_routing_entries_argument(r)
    r.add_argument("--report", metavar="FILE.json", help="write the summary as JSON")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_arguments(r)
    r.set_defaults(func=_run)
    q = sub.add_parser("results", help="print a query's current kNN from Redis")
    q.add_argument("qid", metavar="QID")
    q.add_argument("--json", action="store_true", help="print JSON")
    add_store_arguments(q)
    q.set_defaults(func=_results)
