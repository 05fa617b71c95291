"""Are two trees' Redis writes the same? One fixed ``knnmon run`` and one fixed ``knnmon serve``
with each tree, then every key of each namespace compared (a restructuring must not change what
knnmon writes).

Each run writes into its own namespace of one Redis server. Values are compared as written, but
for what differs from run to run by nature: stream entry ids (their time) and, in the serve's
batch log and status, the fields that are times or measurements (``done_ms``, ``*_ms``,
``lat_hist``, ``heartbeat_ms``, ...), a worker marker's writer tag (random), and the namespace
in the values that name a key. The other tree is a plain checkout, put on ``PYTHONPATH``
as ``benchmarks/ab_run.py`` does.

Usage::

    python benchmarks/payload_ab.py --other /tmp/old --objects DIR --queries FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_run import overlay  # noqa: E402

from knnmon.redis_server import EmbeddedRedis  # noqa: E402

#: Fields of the serve's own streams and status that are times or measurements.
VOLATILE = {"done_ms", "parse_ms", "update_ms", "lat_hist", "refill_ms", "redis_ms", "heartbeat_ms", "started_ms",
            "pid", "host", "busy_ms_per_worker", "latency_ms_p50", "latency_ms_p99", "batching", "worker_processes",
            "worker_nodes", "redis", "data_dir"}
#: An entry's time: the year 2100 (epoch ms), far beyond --max-future.
FUTURE_MS = 4_102_444_800_000


def knnmon(pythonpath: str | None, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "knnmon.coordinator.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=True)


def serve_input(client: redis.Redis, namespace: str, objects: list[dict], queries: list[dict]) -> None:
    """The same entries for every tree: registrations, objects (some duplicates, a malformed
    one, one far in the future), an update and an unregister."""
    qs, os_ = f"{namespace}:ingest:queries", f"{namespace}:ingest:objects"
    for q in queries:
        client.xadd(qs, {"op": "register", "id": q["id"], "lon": repr(q["lon"]), "lat": repr(q["lat"]),
                         "keywords": " ".join(q["keywords"]), "k": q["k"]})
    for i, o in enumerate(objects):
        client.xadd(os_, {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]), "t": o["t"],
                          "keywords": " ".join(o["keywords"])})
        if i % 97 == 0:
            client.xadd(os_, {"id": o["id"], "lon": "0.5", "lat": "0.5", "keywords": "x"})  # duplicate
    client.xadd(os_, {"id": "bad", "lon": "400", "lat": "0"})
    client.xadd(os_, {"id": "future", "lon": "1", "lat": "1", "t": str(FUTURE_MS),
                      "keywords": "x"})
    q = queries[0]
    client.xadd(qs, {"op": "register", "id": q["id"], "lon": repr(q["lon"]), "lat": repr(q["lat"]),
                     "keywords": " ".join(q["keywords"]), "k": int(q["k"]) % 10 + 1})
    client.xadd(qs, {"op": "unregister", "id": queries[1]["id"]})


def dump(client: redis.Redis, namespace: str) -> dict[str, object]:
    """Every key of the namespace (the namespace stripped) -> its value, comparably."""
    out: dict[str, object] = {}
    for key in client.scan_iter(f"{namespace}:*", count=10_000):
        kind = client.type(key)
        name = key[len(namespace) + 1:]
        if kind == "string":
            value = client.get(key)
            if name.startswith("worker:") and name.endswith(":batch"):  # a writer's random tag, then its batch
                value = value.rpartition(":")[2]
            try:
                value = {k: v for k, v in json.loads(value).items() if k not in VOLATILE and k != "config"}
            except (ValueError, AttributeError):
                pass
        elif kind == "hash":
            value = dict(sorted(client.hgetall(key).items()))
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "stream":
            value = [{k: v for k, v in f.items() if k not in VOLATILE and k not in ("first", "last", "_entry")
                      and not (k == "_detail" and f.get("_reason") == "future")}  # it names Redis's clock
                     for _, f in client.xrange(key)]
        else:
            value = kind
        out[name] = json.loads(json.dumps(value).replace(f"{namespace}:", "NS:"))  # a details key names its namespace
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", required=True, help="the other tree (a checkout)")
    p.add_argument("--objects", required=True, help="an ingest output")
    p.add_argument("--queries", required=True, help="a query file")
    p.add_argument("--initial", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--serve-queries", type=int, default=300)
    p.add_argument("--serve-objects", type=int, default=3000)
    a = p.parse_args()
    import pyarrow.parquet as pq

    from knnmon.ingest.reading import read_objects, stream_order

    trees = {"this": None, "other": overlay(a.other)}
    objects = stream_order(read_objects(a.objects), None).slice(0, a.serve_objects).to_pylist()
    queries = pq.read_table(a.queries).slice(0, a.serve_queries).to_pylist()
    dumps: dict[str, dict] = {}
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for name, path in trees.items():
            ns = f"run_{name}"
            knnmon(path, "run", "--objects", a.objects, "--queries", a.queries, "--executor", "inline", "--workers",
                   "2", "--initial", str(a.initial), "--batch", "500", "--batches", str(a.batches), "--sync-writes",
                   "--redis", server.url, "--namespace", ns, "--quiet")
            dumps[ns] = dump(client, ns)
            ns = f"serve_{name}"
            serve_input(client, ns, objects, queries)
            knnmon(path, "serve", "--executor", "inline", "--workers", "2", "--batching", "fixed", "--max-delay-ms",
                   "0", "--idle-exit-s", "2", "--redis", server.url, "--namespace", ns)
            dumps[ns] = dump(client, ns)
    same = True
    for kind in ("run", "serve"):
        this, other = dumps[f"{kind}_this"], dumps[f"{kind}_other"]
        differ = sorted(k for k in this.keys() | other.keys() if this.get(k) != other.get(k))
        print(f"{kind}: {len(this)} keys here, {len(other)} in the other tree; {len(differ)} differ"
              + (f": {differ[:10]}" if differ else ""))
        for k in differ[:3]:
            print(f"  {k}: here {str(this.get(k))[:300]}\n  {' ' * len(k)}  other {str(other.get(k))[:300]}")
        same = same and not differ
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
