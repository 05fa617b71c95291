"""The service loop: ``knnmon serve`` as a separate process, driven by a plain redis-py client through the ingest
streams, on real places, checked against the brute-force oracle; killed with SIGKILL and restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.service.acks import REJECT_FIELD_BYTES
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import (assert_exact, assert_feed_and_objects, knnmon_cli, object_fields, publish_objects,
                           register_fields, serve_process, wait_processed)


def start_serve(url: str, namespace: str, tmp_path, *extra: str) -> subprocess.Popen:
    """``knnmon serve`` in a child process (workers in process: this file tests the service)."""
    return serve_process(url, namespace, tmp_path / f"serve-{time.monotonic_ns()}.log", "--data-dir",
                         str(tmp_path / "data"), *extra, workers=3)


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


@pytest.fixture(scope="module")
def places(places_slice):
    """The 10,000 real places of the slice in stream order, as dicts."""
    return stream_order(read_objects(str(places_slice)), None).to_pylist()


def test_streams_from_a_plain_redis_client_are_exact_and_rejects_are_kept(redis_url, namespace, places,
                                                                          slice_queries, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)  # (a plain client reads the rejects too)
    keys = Keys(namespace)
    queries = pq.read_table(slice_queries).slice(0, 300).to_pylist()
    # Before the service starts: 150 queries and 4,000 objects are waiting in the streams.
    for q in queries[:150]:
        r.xadd(keys.ingest_queries, register_fields(q))
    for o in places[:4000]:
        r.xadd(keys.ingest_objects, object_fields(o))
    proc = start_serve(redis_url, namespace, tmp_path)
    try:
        bad_objects = [
            ({"lon": "1", "lat": "2", "keywords": "x"}, "missing_id"),
            ({"id": "b1", "lon": "abc", "lat": "2", "keywords": "x"}, "non_numeric_coordinates"),
            ({"id": "b2", "lon": "10", "lat": "95", "keywords": "x"}, "latitude_out_of_range"),
            ({"id": "b3", "lon": "10", "lat": "5"}, "no_keywords"),
            ({"id": "b4", "lon": "10", "lat": "5", "keywords": "x", "t": "noon"}, "bad_time"),
            ({**object_fields(places[0]), "lon": "1.5"}, "duplicate_id"),
            ({"id": "b5", "lon": "0", "lat": "0", "keywords": "x"}, "null_island"),
            ({"id": "b 6", "lon": "10", "lat": "5", "keywords": "x"}, "bad_id"),
            ({"id": "b7", "lon": "10", "lat": "5", "keywords": "x", "text": "t" * 70_000}, "field_too_large"),
            ({"id": "b8", "lon": "10", "lat": "5", "keywords": "x", "t": "9" * 25}, "bad_time"),
            ({"id": "b9", "lon": "10", "lat": "5", "keywords": " ".join(f"w{i}" for i in range(40))},
             "too_many_keywords"),
        ]
        for fields, _ in bad_objects:
            r.xadd(keys.ingest_objects, fields)
        raw = redis.Redis.from_url(redis_url)  # bytes that are not UTF-8, as any client may send them
        raw.xadd(keys.ingest_objects, {b"id": b"b10\xff", b"lon": b"10", b"lat": b"5", b"keywords": b"x"})
        raw.xadd(keys.ingest_objects, {b"id": b"b11", b"lon": b"10", b"lat": b"5", b"keywords": b"caf\xe9"})
        raw.xadd(keys.ingest_queries, {b"op": b"register", b"id": b"z8\xc3", b"lon": b"10", b"lat": b"5",
                                       b"keywords": b"x", b"k": b"1"})
        bad_objects += [(None, "not_utf8"), (None, "not_utf8")]
        # While it runs: the rest of the objects (1,000 of them as raw text), queries registered
        # mid-stream, an update, an unregister, and bad operations.
        for i, o in enumerate(places[4000:]):
            r.xadd(keys.ingest_objects, object_fields(o, use_text=3000 <= i < 4000))
            if i % 40 == 0 and 150 + i // 40 < len(queries):
                r.xadd(keys.ingest_queries, register_fields(queries[150 + i // 40]))
        bad_ops = [
            ({"op": "fly", "id": "z"}, "unknown_op"),
            ({**register_fields(queries[0]), "k": "0"}, "bad_k"),
            ({"op": "register", "id": "z2", "lat": "1", "keywords": "a", "k": "1"}, "missing_coordinates"),
            ({**register_fields(queries[0]), "id": "z3", "keywords": "the of"}, "no_keywords"),
            ({**register_fields(queries[0]), "id": "z4", "k": "99999999999999999999"}, "k_too_large"),
            ({**register_fields(queries[0]), "id": "z5", "k": "100000000"}, "k_too_large"),
            ({**register_fields(queries[0]), "id": "z6", "lon": "0", "lat": "0"}, "null_island"),
            ({**register_fields(queries[0]), "id": "z 7"}, "bad_id"),
        ]
        for fields, _ in bad_ops:
            r.xadd(keys.ingest_queries, fields)
        bad_ops.append((None, "not_utf8"))
        r.xadd(keys.ingest_queries, {"op": "unregister", "id": "never-registered"})
        r.xadd(keys.ingest_queries, register_fields(queries[1], k=queries[1]["k"] + 3))  # an update
        r.xadd(keys.ingest_queries, {"op": "unregister", "id": queries[2]["id"]})
        wait_processed(r, keys, proc)
        assert stop(proc) == 0  # SIGTERM: drains and exits cleanly
    finally:
        if proc.poll() is None:
            proc.kill()
    registered = [q for q in queries if q["id"] != queries[2]["id"]]
    registered[1] = {**registered[1], "k": registered[1]["k"] + 3}
    oracle = BruteForceKnn(pa.Table.from_pylist(places))
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(registered), oracle) == 299
    assert not r.exists(keys.result(queries[2]["id"])) and not r.exists(keys.query(queries[2]["id"]))
    assert r.scard(keys.queries) == 299
    rejects = r.xrange(keys.ingest_rejects)
    want = Counter(reason for _, reason in bad_objects + bad_ops)
    assert Counter(f["_reason"] for _, f in rejects) == want
    bad = [f for _, f in rejects if f["_reason"] == "not_utf8"]  # escaped, each such field named with its size
    assert sorted((f["id"], f.get("keywords"), f["_escaped"]) for f in bad) == [
        ("b10\\xff", "x", "id:4"), ("b11", "caf\\xe9", "keywords:4"), ("z8\\xc3", "x", "id:3")]
    # Every rejected entry left its stream (one rule: a 70 kB field as a duplicate): what stays was applied.
    assert r.xlen(keys.ingest_objects) == len(places)
    assert r.xlen(keys.ingest_queries) == 300 + 3  # the registrations, the update, two unregisters
    dup = next(f for _, f in rejects if f["_reason"] == "duplicate_id")
    assert dup["lon"] == "1.5" and dup["_stream"] == keys.ingest_objects  # the original fields are kept
    big = next(f for _, f in rejects if f["_reason"] == "field_too_large")  # ... but not 64 KiB of them
    assert big["id"] == "b7" and big["text"] == "t" * REJECT_FIELD_BYTES and big["_truncated"] == "text:70000"
    from knnmon.coordinator.service.status import format_status, read_status

    status = read_status(redis_url, namespace)
    svc = status["service"]
    assert (svc["unregister_unknown"], svc["updated"], svc["registered"], svc["objects"]) == (1, 1, 301, 10_000)
    assert not status["running"] and status["queries"] == 299 and status["rejects"] == len(rejects)
    assert status["objects_stream"]["pending"] == 0 and status["objects_stream"]["undelivered"] == 0
    text = format_status(status)
    assert "NOT running" in text and f"rejects: {len(rejects)}" in text


# (-m slow: the model-based test drops the service in the middle of a batch in every default run,
# and its Ray variant SIGKILLs it; this one kills a child process twice on 10,000 places)
@pytest.mark.slow
def test_serve_killed_mid_stream_loses_nothing_and_duplicates_nothing(redis_url, namespace, places, slice_queries,
                                                                       tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    queries = pq.read_table(slice_queries).slice(0, 1500).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    publish_objects(r, keys, places)
    bad = r.xadd(keys.ingest_objects, {"id": "bad", "lon": "x", "lat": "0", "keywords": "a"})
    proc = start_serve(redis_url, namespace, tmp_path, "--set", "serve.batch=100")
    kills = 0
    try:
        for after in (5, 50):  # SIGKILL once that many object batches are done, then start again
            deadline = time.monotonic() + 120
            while (not r.exists(keys.serve_batches) or r.xlen(keys.serve_batches) < after) and time.monotonic() < deadline:
                time.sleep(0.005)
            proc.kill()
            proc.wait()
            kills += 1
            proc = start_serve(redis_url, namespace, tmp_path, "--set", "serve.batch=100")
        wait_processed(r, keys, proc, timeout_s=300)
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert kills == 2
    oracle = BruteForceKnn(pa.Table.from_pylist(places))
    assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), oracle)
    assert_feed_and_objects(r, keys, [q["id"] for q in queries])  # nothing duplicated or lost
    assert [f["_entry"] for _, f in r.xrange(keys.ingest_rejects)] == [bad]  # once, and it left the stream
    assert r.xlen(keys.ingest_objects) == len(places)


@pytest.mark.slow  # 9-14 s; the model-based test restarts Redis under the service at random steps
def test_serve_rides_out_redis_going_away(places, slice_queries, tmp_path):
    """Redis stops (saving) and comes back two seconds later, as a new process: the service
    waits, finds every write kept, and goes on without a rebuild; exact, nothing lost or twice."""
    from knnmon.redis_server import EmbeddedRedis, free_port

    port = free_port()
    server = EmbeddedRedis(str(tmp_path / "redis"), port=port, durable=True).start()
    url, namespace = server.url, "gone"
    r = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(namespace)
    queries = pq.read_table(slice_queries).slice(0, 200).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    for o in places[:5000]:
        r.xadd(keys.ingest_objects, object_fields(o))
    proc = start_serve(url, namespace, tmp_path)
    try:
        wait_processed(r, keys, proc)
        server.stop()  # Redis goes away (saving), and comes back two seconds later
        time.sleep(2.0)
        assert proc.poll() is None  # serve waits, retrying
        server = EmbeddedRedis(str(tmp_path / "redis"), port=port, durable=True).start()
        r = redis.Redis.from_url(url, decode_responses=True)
        for o in places[5000:]:
            r.xadd(keys.ingest_objects, object_fields(o))
        wait_processed(r, keys, proc)
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
        server = EmbeddedRedis(str(tmp_path / "redis"), port=port, durable=True).start()
    try:
        oracle = BruteForceKnn(pa.Table.from_pylist(places))
        assert assert_exact(url, namespace, pa.Table.from_pylist(queries), oracle) == 200
        log = "".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
        assert "unreachable" in log and "nothing rebuilt" in log
        assert '"recoveries": 0' in log and '"redis_outages": 1' in log
        assert_feed_and_objects(redis.Redis.from_url(url, decode_responses=True), keys, [q["id"] for q in queries])
    finally:
        server.stop()


def test_python_client_round_trip_on_an_embedded_redis_that_survives_a_killed_serve(places, tmp_path):
    """No --redis: serve starts its embedded, durable Redis; after SIGKILL the restarted serve
    adopts the server that is still running; the Python client sees exact results and changes."""
    from knnmon.client import KnnClient

    def serve() -> subprocess.Popen:
        log = open(tmp_path / f"serve-{time.monotonic_ns()}.log", "w")
        env = {k: v for k, v in os.environ.items() if k != "KNNMON_REDIS_URL"}
        return subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--workers", "2",
                                 "--set", "workers.executor=inline", "--data-dir", str(tmp_path / "data")],
                                stdout=log, stderr=subprocess.STDOUT, env=env)

    def server_url() -> str:
        pid_file = tmp_path / "data" / "redis" / "server.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return f"redis://127.0.0.1:{pid_file.read_text().split()[1]}/0"

    proc = serve()
    try:
        url = server_url()
        client = KnnClient(url)
        q = places[100]
        client.register("c1", q["lon"], q["lat"], q["keywords"][:1], k=4)
        client.publish({"id": o["id"], "lon": o["lon"], "lat": o["lat"], "t": o["t"], "keywords": o["keywords"]}
                       for o in places[:3000])
        assert client.wait(timeout_s=120) == []
        bad = client.publish([{"id": "c-bad", "lon": 10, "lat": 5, "keywords": "x", "t": 2**62},  # far future
                              {"id": "c-ok", "lon": 10, "lat": 5, "keywords": "x"}])
        bad += [client.register("c-k0", 10, 5, ["zzz"], k=1)]
        client.client.xadd(client.keys.ingest_queries, {"op": "fly", "id": "c-k0"})  # (not this client's: unseen)
        rejected = client.wait(timeout_s=120)  # says which of its entries were rejected, and why
        assert [(e.entry_id, e.stream, e.reason) for e in rejected] == [(bad[0], client.keys.ingest_objects, "future")], \
            (bad, rejected)
        assert client.processed(bad[0]) and client.rejects(1, newest_first=True)[0][1]["_reason"] == "unknown_op"
        client.unregister("c-k0")
        proc.kill()  # the service dies; its Redis keeps running
        proc.wait()
        proc = serve()
        client.wait(client.register("c0", q["lon"], q["lat"], ["zzz"], k=1), timeout_s=120)
        assert server_url() == url  # the same server, adopted: nothing was lost
        first, second_log = [p.read_text() for p in sorted(tmp_path.glob("serve-*.log"))]
        assert "fresh start" in first and "recovery:" not in first  # (a first start recovers nothing)
        assert "recovery:" in second_log and "fresh start" not in second_log
        client.unregister("c0")
        client.publish({"id": o["id"], "lon": o["lon"], "lat": o["lat"], "t": o["t"], "keywords": o["keywords"]}
                       for o in places[3000:6000])
        client.wait(timeout_s=120)
        want = BruteForceKnn(pa.Table.from_pylist(places[:6000])).knn(q["lon"], q["lat"], q["keywords"][:1], 4)
        got = client.results("c1")
        assert [o for o, _ in got] == [o for o, _ in want]
        assert client.query("c1")["k"] == "4"
        # Discovery: status and results with no --redis find the running service's server (and
        # start no second one); a second service on the same data directory is refused.
        data = ["--data-dir", str(tmp_path / "data")]
        deadline = time.monotonic() + 60  # (its status is refreshed every second: waited for)
        while "service: running" not in (status := knnmon_cli("status", *data)).stdout:
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.2)
        assert status.returncode == 0
        found = knnmon_cli("results", "c1", "--json", *data)
        assert found.returncode == 0 and [o["id"] for o in json.loads(found.stdout)["knn"]] == [o for o, _ in got]
        assert server_url() == url
        second = knnmon_cli("serve", "--set", "workers.executor=inline", *data)
        assert second.returncode == 2 and "is running in namespace 'knn'" in second.stderr
        assert server_url() == url
        changes = [c for c in client.changes() if c.qid == "c1"]
        assert changes and changes[0].left == []  # the registration: all entered
        # docs/clients.md: a fresh service's start takes version 1 for its recovery's repairs, so
        # what is registered before its first batch carries 2, and the batches 3 on.
        assert changes[0].version == 2 and all(c.version >= 3 for c in changes[1:])
        versions = [c.version for c in changes]
        assert versions == sorted(set(versions))  # increasing: one change per batch, none twice
        members: set[str] = set()
        for c in changes:  # the feed alone reproduces the result
            members = (members - set(c.left)) | set(c.entered)
        assert members == {o for o, _ in got}
        assert client.changes(since=client.changes()[-1].entry_id) == []
        client.unregister("c1")
        client.wait(timeout_s=60)
        assert client.results("c1") == [] and client.query("c1") == {}
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:  # (a failure above: the embedded server it leaves is stopped too)
            proc.kill()
            proc.wait()
            from knnmon.redis_server import EmbeddedRedis

            if (left := EmbeddedRedis.running(str(tmp_path / "data" / "redis"))) is not None:
                os.kill(left[0], signal.SIGKILL)
    # A clean stop also stopped the embedded server.
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server_url()).ping()
