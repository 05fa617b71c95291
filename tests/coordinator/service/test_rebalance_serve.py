"""Re-balancing in ``knnmon serve``: a service restarted over registered queries plans them by
space; a stream that then drifts (west first, east after) moves queries between its workers;
results stay exact against the oracle, and ``knnmon explain`` says where a moved query came
from and why."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.ingest.reading import read_objects
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import (assert_exact, assert_feed_and_objects, knnmon_cli, object_fields, register_fields,
                            serve_process, wait_processed)


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def test_serve_moves_queries_under_drift_and_explains_them(redis_url, namespace, places_slice, slice_queries,
                                                           tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    objects = read_objects(str(places_slice))
    order = np.random.default_rng(4).permutation(objects.num_rows)
    first = objects.take(pa.array(order[:2000]))
    rest = objects.take(pa.array(order[2000:6000]))
    rest = rest.take(pa.array(np.argsort(rest.column("lon").to_numpy(), kind="stable")))  # west to east
    queries = pq.read_table(slice_queries).slice(0, 800).to_pylist()

    def serve(*extra: str) -> subprocess.Popen:
        return serve_process(redis_url, namespace, tmp_path / f"serve-{time.monotonic_ns()}.log", "--data-dir",
                             str(tmp_path / "data"), "--set", "serve.batch=200", *extra, workers=3)

    proc = serve()  # the queries and the first objects, placed as they come
    try:
        for q in queries:
            r.xadd(keys.ingest_queries, register_fields(q))
        for o in first.to_pylist():
            r.xadd(keys.ingest_objects, object_fields(o))
        wait_processed(r, keys, proc)
        assert _stop(proc) == 0
        # Restarted: the queries found in Redis are planned by space, then the stream drifts.
        proc = serve("--set", "workers.algorithm=space", "--rebalance", "--set", "rebalance.trigger=window", "--set",
                     "rebalance.window_batches=3",
                     "--set", "rebalance.threshold=1.05", "--set", "rebalance.budget=0.15", "--set",
                         "rebalance.min_gain=0")
        for o in rest.to_pylist():
            r.xadd(keys.ingest_objects, object_fields(o))
        wait_processed(r, keys, proc)
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    oracle = BruteForceKnn(pa.concat_tables([first, rest]))
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), oracle) == len(queries)
    assert_feed_and_objects(r, keys, [q["id"] for q in queries])
    replans = [json.loads(x) for x in r.lrange(keys.replans, 0, -1)]
    assert replans and sum(x["queries_moved"] for x in replans) > 0
    moved = [q["id"] for q in queries if r.hexists(keys.query(q["id"]), "moved_from")]
    assert moved
    h = r.hgetall(keys.query(moved[0]))
    out = knnmon_cli("explain", moved[0], "--redis", redis_url, "--namespace", namespace, "--json")
    assert out.returncode == 0, out.stderr
    e = json.loads(out.stdout)
    assert e["worker"] == int(h["worker"]) and e["moved"]["from"] == int(h["moved_from"])
    assert e["moved"]["replan"]["replan"] == int(h["moved_replan"])
    assert e["set"] is not None and e["plan"]["algorithm"] == "space"
    text = knnmon_cli("explain", moved[0], "--redis", redis_url, "--namespace", namespace)
    assert f"moved from worker {h['moved_from']}" in text.stdout and "why: slowest / mean" in text.stdout
    missing = knnmon_cli("explain", "no-such-query", "--redis", redis_url, "--namespace", namespace)
    assert missing.returncode != 0 and "no query" in missing.stderr and "Traceback" not in missing.stderr
