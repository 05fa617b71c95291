"""How ``knnmon serve`` forms batches: the policy's rules, an idle service answering at once, and
Short-Job-First minibatches exact against the oracle with every object's response time recorded."""

from __future__ import annotations

import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.service import latency
from knnmon.coordinator.service.batching import BatchPolicy
from knnmon.errors import InvalidArgumentError
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import assert_exact, object_fields, publish_objects, register_fields, serve_process, wait_processed


def test_the_policy_rejects_bad_settings():
    for kwargs in ({"policy": "eager"}, {"batch": 0}, {"max_delay_ms": -1}, {"max_delay_ms": float("inf")},
                   {"max_delay_ms": float("nan")}, {"latency_target_ms": 0},
                   {"latency_target_ms": float("nan")}):
        with pytest.raises(InvalidArgumentError):
            BatchPolicy(**kwargs)


def test_only_the_fixed_policy_waits():
    assert BatchPolicy("fixed", max_delay_ms=20).wait_ms == 20
    assert BatchPolicy("no-wait", max_delay_ms=20).wait_ms == 0 == BatchPolicy("adaptive").wait_ms


def test_adaptive_minibatches_follow_the_latency_target_and_the_arrival_rate():
    p = BatchPolicy("adaptive", batch=1000, latency_target_ms=50)
    assert p.size() == 1000  # nothing measured yet
    for m in (1, 10, 100, 400, 1000) * 4:  # T(m) = 5 ms + 0.05 ms per object
        p.observe(m, 0.005 + 0.00005 * m)
    a, b = p.cost()
    assert a == pytest.approx(0.005, rel=1e-6) and b == pytest.approx(0.00005, rel=1e-6)
    now = 1000.0
    p.read(200, now)  # 100 objects/s: latency decides, 2 T(m) <= 50 ms
    assert p.size(now) == pytest.approx((0.025 - 0.005) / 0.00005, abs=1)
    p.read(40_000, now)  # 20,100 objects/s over the window: saturated, whole reads
    assert p.size(now) == 1000
    assert p.size(now + 10) == pytest.approx(400, abs=1)  # the burst left the window
    assert p.size(now, backlog=True) == 1000
    parts = p.cut(1000, now=now + 10)
    assert [len(x) for x in parts] == [334, 333, 333]  # equal parts (m = 399 or 400), no tiny tail
    assert np.concatenate(parts).tolist() == list(range(1000))  # in stream order
    small = p.cut(5, now=now + 10)
    assert p.cut(0) == []
    assert len(small) == 1 and small[0].tolist() == list(range(5))


def test_a_read_whose_minibatches_fall_behind_the_stream_has_the_rest_in_one_batch():
    p = BatchPolicy("adaptive", batch=1000, latency_target_ms=50)
    for m in (10, 50, 100, 500) * 4:  # a sparse region: T(m) = 5 ms + 0.1 ms per object
        p.observe(m, 0.005 + 0.0001 * m)
    now = 1000.0
    p.read(2000, now)  # 1,000 objects/s over the window
    parts = p.cut(1000, now=now)
    assert len(parts) > 3  # cut fine for the sparse region's cost
    # a dense region: the first minibatch took 150 ms, far slower than 1,000 objects/s arrive
    merged = p.regroup(parts, 1, len(parts[0]), 0.150, now=now)
    assert [len(x) for x in merged] == [len(parts[0]), 1000 - len(parts[0])]
    assert np.concatenate(merged).tolist() == list(range(1000)) and p.regrouped == 1
    assert p.state(now)["regrouped"] == 1
    # minibatches that keep up stay as they are, and so does a read with one minibatch left
    assert p.regroup(parts, 1, len(parts[0]), 0.2 * len(parts[0]) / 1000, now=now) is parts
    assert p.regroup(parts, len(parts) - 1, 900, 5.0, now=now) is parts
    assert p.regrouped == 1
    assert BatchPolicy("no-wait", batch=4).regroup(parts, 1, 2, 1.0, now=now) is parts  # only adaptive regroups


@pytest.fixture(scope="module")
def places(places_slice):
    return stream_order(read_objects(str(places_slice)), None).to_pylist()


def _answer_time(r: redis.Redis, keys: Keys, qid: str, obj: dict) -> float:
    """Publish ``obj`` and return the seconds until it is in ``qid``'s result."""
    t0 = time.monotonic()
    r.xadd(keys.ingest_objects, object_fields(obj))
    while obj["id"] not in r.zrange(keys.result(qid), 0, -1):
        assert time.monotonic() - t0 < 30
        time.sleep(0.002)
    return time.monotonic() - t0


def test_an_idle_service_answers_one_object_without_the_delay(redis_url, namespace, places, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    times = {}
    for policy in ("adaptive", "fixed"):
        keys = Keys(f"{namespace}-{policy}")
        q = {"id": "q1", "lon": places[0]["lon"], "lat": places[0]["lat"], "keywords": places[0]["keywords"][:1],
             "k": 3}
        r.xadd(keys.ingest_queries, register_fields(q))
        proc = serve_process(redis_url, keys.namespace, tmp_path / f"{policy}.log", "--set", f"serve.batching={policy}",
                             "--set", "serve.max_delay_ms=2000", "--data-dir", str(tmp_path / policy))
        try:
            wait_processed(r, keys, proc)
            time.sleep(0.5)  # idle
            obj = {**places[0], "id": "fresh-1"}
            times[policy] = _answer_time(r, keys, "q1", obj)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert times["fixed"] >= 1.9  # it waited the delay for more objects
    assert times["adaptive"] < 1.0  # it did not


def test_a_burst_is_exact_in_stream_order_and_records_every_response_time(redis_url, namespace, places,
                                                                          slice_queries, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    queries = pq.read_table(slice_queries).slice(0, 200)
    for q in queries.to_pylist():
        r.xadd(keys.ingest_queries, register_fields(q))
    proc = serve_process(redis_url, namespace, tmp_path / "serve.log", "--set", "serve.batching=no-wait",
                         "--set", "serve.batch=200", "--data-dir", str(tmp_path / "data"))
    try:
        wait_processed(r, keys, proc)
        publish_objects(r, keys, places)  # one burst: reads of up to 200 entries
        wait_processed(r, keys, proc, timeout_s=300)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert assert_exact(redis_url, namespace, queries, BruteForceKnn(pa.Table.from_pylist(places))) == 200
    records = [f for _, f in r.xrange(keys.serve_batches)]
    hist = latency.decode(f.get("lat_hist", "") for f in records)
    objects = sum(int(f["objects"]) for f in records)
    assert int(hist.sum()) == objects == len(places) - int(r.xlen(keys.ingest_rejects))
    assert max(int(f["objects"]) for f in records) <= 200 and len(records) >= len(places) // 200
    assert 0 < latency.percentile(hist, 50) <= latency.percentile(hist, 99) < 300_000
    # Acknowledged in stream order: each batch's entries all come after the previous batch's.
    pos = {e: i for i, (e, _) in enumerate(r.xrange(keys.ingest_objects))}
    ranges = [(pos[f["first"]], pos[f["last"]]) for f in records]
    assert all(b[0] > a[1] for a, b in zip(ranges, ranges[1:]))
    from knnmon.coordinator.service.status import format_status, read_status

    status = read_status(redis_url, namespace)
    b = status["service"]["batching"]
    assert b["policy"] == "no-wait" and b["minibatch"] == 200
    assert b["cost_fixed_ms"] is not None and b["cost_per_object_ms"] > 0
    assert "batching no-wait: minibatches of up to 200 objects" in format_status(status)
