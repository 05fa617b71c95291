"""Redis AUTH end to end (a password, and an ACL user): run, results, status, serve, the client and
the workers work, and the password appears in no output, log, report or key."""

from __future__ import annotations

import json
import time

import pytest
import redis

from knnmon.client import KnnClient
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.redis_server import EmbeddedRedis
from tests.support import client_round_trip, dump_keys, knnmon_cli, run_exact, serve_process

SECRET = "s3cret-Pw-4711"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    """A real redis-server that requires ``SECRET``, and an ACL user ``knn`` with the same password."""
    with EmbeddedRedis(str(tmp_path_factory.mktemp("locked")), password=SECRET) as server:
        r = redis.Redis.from_url(server.url)
        r.acl_setuser("knn", enabled=True, passwords=[f"+{SECRET}"], keys=["*"], channels=["*"], commands=["+@all"])
        yield server


def test_run_results_and_status_with_a_password_never_show_it(locked_redis, places_slice, slice_queries, namespace,
                                                               tmp_path):
    url = locked_redis.url
    assert SECRET in url
    run, report = run_exact(url, namespace, str(places_slice), load_queries(str(slice_queries)).slice(0, 300), tmp_path)
    assert "***" in run.stdout  # the URL is shown, its password masked
    results = knnmon_cli("results", "q0", "--json", "--redis", url, "--namespace", namespace)
    status = knnmon_cli("status", "--redis", url, "--namespace", namespace)
    assert results.returncode == 0 and status.returncode == 0, (results.stderr, status.stderr)
    wrong = knnmon_cli("results", "q0", "--redis", url.replace(SECRET, "wrong"), "--namespace", namespace)
    assert wrong.returncode != 0
    for text in (run.stdout, run.stderr, results.stdout, results.stderr, status.stdout, status.stderr,
                 wrong.stdout, wrong.stderr, report):
        assert SECRET not in text
    assert SECRET not in dump_keys(redis.Redis.from_url(url, decode_responses=True), f"{namespace}:*")


def test_serve_and_the_client_as_an_acl_user(locked_redis, places_slice, namespace, tmp_path):
    url = locked_redis.url.replace("redis://:", "redis://knn:")
    places = stream_order(read_objects(str(places_slice)), None).slice(0, 2000).to_pylist()
    proc = serve_process(url, namespace, tmp_path / "serve.log", "--log-format", "json")
    try:
        got, want = client_round_trip(KnnClient(url, namespace), places, "s1", 5)
        assert got == want
        deadline = time.monotonic() + 60  # (its status is refreshed every second: waited for)
        while '"running": true' not in (status := knnmon_cli("status", "--json", "--redis", url, "--namespace",
                                                             namespace)).stdout:
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.2)
        assert status.returncode == 0
        assert SECRET not in status.stdout + status.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    log = (tmp_path / "serve.log").read_text()
    assert SECRET not in log
    records = [json.loads(line) for line in log.splitlines()]  # every line is one JSON object
    assert records and all({"time", "level", "logger", "event", "batch", "worker"} <= r.keys() for r in records)
    assert any(r["event"].startswith("knnmon serve: 2 workers") and "***" in r["event"] for r in records)
    assert any(r["event"].startswith("knnmon serve: stopped") for r in records)
    keys = dump_keys(redis.Redis.from_url(url, decode_responses=True), f"{namespace}:*")
    assert f"{namespace}:serve:status" in keys and SECRET not in keys
