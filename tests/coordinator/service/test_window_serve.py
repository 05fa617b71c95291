"""``knnmon serve --window``: exact over the live objects across a SIGKILL and the checkpoints'
trims of the objects stream; late objects rejected; the change feed and object hashes consistent."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import (assert_exact, assert_feed_and_objects, publish_objects, register_fields, serve_process,
                            wait_processed)

WINDOW_S = 1500


def start_serve(url: str, namespace: str, tmp_path) -> subprocess.Popen:
    return serve_process(url, namespace, tmp_path / f"serve-{time.monotonic_ns()}.log", "--data-dir",
                         str(tmp_path / "data"), "--set", "serve.batch=100", "--window", f"{WINDOW_S}s",
                         "--set", "serve.checkpoint_interval_s=0.2", workers=3)


@pytest.mark.slow  # 17 s; the model-based test drops a windowed service (SIGKILL) and starts a new one
def test_window_across_sigkill_and_trims(redis_url, namespace, places_slice, slice_queries, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None)
    t = ARRIVAL_EPOCH_MS + 1000 * pa.array(range(places.num_rows), pa.int64()).to_numpy()  # one object per second
    places = places.set_column(places.column_names.index("t"), "t", pa.array(t)).to_pylist()
    queries = pq.read_table(slice_queries).slice(0, 1500).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    late = [{**places[i], "id": f"late-{i}"} for i in range(20)]  # as old as the first places: expired on arrival
    publish_objects(r, keys, places + late)
    published = r.xlen(keys.ingest_objects)
    proc = start_serve(redis_url, namespace, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while (not r.exists(keys.serve_checkpoint) or not r.hget(keys.serve_checkpoint, "trimmed_below")
               or r.xlen(keys.serve_batches) < 40) and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.kill()  # SIGKILL after a trim, mid-stream
        proc.wait()
        assert r.xlen(keys.ingest_objects) < published  # trimmed below what the window needs
        assert r.hlen(keys.serve_snapshot)  # the restart takes the checkpoints' chunks (object_snapshot)
        proc = start_serve(redis_url, namespace, tmp_path)
        wait_processed(r, keys, proc, timeout_s=300)
        time.sleep(0.5)  # one more checkpoint after the last batch
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    applied = pa.Table.from_pylist(places)
    live = applied.filter(pa.array(applied.column("t").to_numpy() > t.max() - WINDOW_S * 1000))
    assert live.num_rows == WINDOW_S
    assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), BruteForceKnn(live))
    rejects = Counter(f["_reason"] for _, f in r.xrange(keys.ingest_rejects))
    assert rejects == {"late": 20}
    # The stream keeps about what the window needs (+ up to one checkpoint interval of batches).
    assert r.xlen(keys.ingest_objects) < WINDOW_S + 2000
    # The change feed replays to every result, versions increasing; object hashes: exactly the
    # (live) objects in some result, each counting the results holding it.
    assert_feed_and_objects(r, keys, [q["id"] for q in queries])
    # Each batch's record says where its time went (benchmarks/slow_batches.py at 68de8c7 reads it).
    records = [f for _, f in r.xrange(keys.serve_batches) if int(f["objects"])]
    assert records and all(float(f[k]) >= 0 for f in records
                           for k in ("update_ms", "refill_ms", "route_ms", "busy_max_ms", "busy_wall_max_ms"))
    assert max(float(f["busy_wall_max_ms"]) for f in records) > 0


def test_a_late_entry_pending_at_a_crash_is_rejected_by_the_recovery(redis_url, namespace, places_slice, tmp_path):
    """An entry delivered to a service that died before acknowledging it is applied by the next
    one's recovery; a late one (expired on arrival) is rejected as ``late`` there, with its
    fields, like any late entry: nothing is dropped without a reason."""
    from knnmon.protocol import GROUP

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None).slice(0, 400)
    t = ARRIVAL_EPOCH_MS + 1000 * pa.array(range(places.num_rows), pa.int64()).to_numpy()
    places = places.set_column(places.column_names.index("t"), "t", pa.array(t)).to_pylist()
    proc = start_serve(redis_url, namespace, tmp_path)
    try:
        publish_objects(r, keys, places[:300])
        wait_processed(r, keys, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    late = {**places[0], "id": "late-pending", "t": places[0]["t"] - 2 * WINDOW_S * 1000}  # long expired
    publish_objects(r, keys, [late, *places[300:]])
    got = r.xreadgroup(GROUP, "serve", {keys.ingest_objects: ">"}, count=1000)  # delivered, never acknowledged
    assert len(got[0][1]) == 101
    proc = start_serve(redis_url, namespace, tmp_path)
    try:
        wait_processed(r, keys, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    rejects = [f for _, f in r.xrange(keys.ingest_rejects)]
    assert [(f["id"], f["_reason"]) for f in rejects] == [("late-pending", "late")]
    assert not r.xpending(keys.ingest_objects, GROUP)["pending"]
