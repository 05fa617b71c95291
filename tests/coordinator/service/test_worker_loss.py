"""A Ray worker process killed under ``knnmon serve``: the lost worker alone is revived in place
(from Redis; with a window over the live objects, Redis repaired to match), never every worker
rebuilt; the service keeps serving and stays exact; nothing acknowledged is lost or applied
twice, and each details hash holds exactly its results' objects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.runtime.preparation import with_arrival_times
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import (assert_exact, assert_feed_and_objects, knnmon_cli, publish_objects,
                                       register_fields, wait_processed)


def _status(url: str, namespace: str) -> dict:
    s = knnmon_cli("status", "--json", "--redis", url, "--namespace", namespace)
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout)["service"]


def _ready(url: str, want: bool, timeout_s: float = 60) -> dict:
    """Poll ``/readyz`` until it answers ``want`` (200 or 503); its checks."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                code, body = resp.status, resp.read()
        except urllib.error.HTTPError as ex:
            code, body = ex.code, ex.read()
        if code == (200 if want else 503):
            return json.loads(body)["checks"]
        assert time.monotonic() < deadline, (code, body)
        time.sleep(0.3)


# -m slow (15-40 s each): a worker process killed mid-stream is revived exactly in test_runtime's
# default tests, and serve through worker losses, stops and restarts is the model-based test's
@pytest.mark.slow
@pytest.mark.parametrize("window_s", [None, 1500], ids=["append-only", "window"])
def test_a_killed_worker_process_is_rebuilt_and_serve_stays_exact(redis_url, namespace, places_slice, slice_queries,
                                                                   tmp_path, window_s):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None)
    extra: list[str] = []
    if window_s:  # one place per second; the oracle sees the live ones
        places = with_arrival_times(places, 1000)
        extra = ["--window", f"{window_s}s"]
    places = places.to_pylist()
    queries = pq.read_table(slice_queries).slice(0, 300).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    env = {k: v for k, v in os.environ.items() if k != "KNNMON_REDIS_URL"}
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", redis_url,
                                 "--namespace", namespace, "--workers", "2", "--set", "serve.batch=250", "--set",
                                     "serve.max_delay_ms=5",
                                 "--metrics", "127.0.0.1:0", "--log-format", "json", *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        publish_objects(r, keys, places[:4000])
        wait_processed(r, keys, proc, timeout_s=300)
        deadline = time.monotonic() + 60
        while not all(w.get("pid") for w in _status(redis_url, namespace).get("worker_processes") or [{}]):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        victim = _status(redis_url, namespace)["worker_processes"][1]["pid"]
        readyz = f"http://{_status(redis_url, namespace)['metrics']}/readyz"
        assert _ready(readyz, True)
        os.kill(victim, signal.SIGKILL)  # the worker's Ray process dies
        checks = _ready(readyz, False)  # /readyz notices before any batch needs the worker
        assert checks["workers"] == "worker(s) 1 dead" and checks["redis"] == "ok", checks
        assert _ready(readyz, True)  # the idle service revives it (no batch asked for it)
        assert _status(redis_url, namespace)["workers_revived"] >= 1
        publish_objects(r, keys, places[4000:])
        wait_processed(r, keys, proc, timeout_s=300)
        deadline = time.monotonic() + 60  # (the status is refreshed every second: waited for)
        while victim in [w["pid"] for w in _status(redis_url, namespace)["worker_processes"]]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        status = _status(redis_url, namespace)
        assert status["workers_revived"] >= 1 and status["worker_restarts"] == 0  # in place, no rebuild
        assert victim not in [w["pid"] for w in status["worker_processes"]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    records = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines()]
    revived = [r for r in records if r["event"].startswith("worker 1 revived")]
    assert revived and revived[0]["worker"] == 1 and revived[0]["batch"] is None, revived  # (revived while idle)
    applied = places[-window_s:] if window_s else places
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries),
                        BruteForceKnn(pa.Table.from_pylist(applied))) == 300
    assert_feed_and_objects(r, keys, [q["id"] for q in queries])  # nothing applied twice
