"""The checkpoints' chunks of the live objects (``coordinator/recovery/object_snapshot.py``): a
start that takes them reads back exactly what parsing the whole objects stream gives, a chunk a
client tampered with is left out (its range parsed), and the trim drops them with their entries."""

from __future__ import annotations

import base64
import json
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS
from knnmon.coordinator.recovery.object_log import OBJECT_SCHEMA, read_objects as read_log
from knnmon.coordinator.recovery.object_snapshot import decode, encode
from tests.support import publish_objects, register_fields, serve_process
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.protocol import entry_order

WINDOW_MS = 1_200_000  # 1,200 places at one a second


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("id")


def _read(r: redis.Redis, keys: Keys, window_ms: int = WINDOW_MS):
    return read_log(r, keys, OBJECT_SCHEMA.empty_table(), DEFAULT_LIMITS, frozenset(), window_ms, 0)


def _same(a, b) -> None:
    assert _sorted(a.objects).equals(_sorted(b.objects))
    assert a.pending == b.pending and a.read == b.read
    assert [(e, r.reason) for e, _, r in a.rejects] == [(e, r.reason) for e, _, r in b.rejects]
    assert sorted(a.unacked, key=lambda u: u[0]) == sorted(b.unacked, key=lambda u: u[0])


@pytest.fixture(scope="module", params=[pytest.param("0.2", marks=pytest.mark.slow), "0.001"],
                ids=["checkpoints-0.2s", "checkpoint-every-read"])  # (0.2 s: 8 s)
def stopped_service(request, places_slice, slice_queries, redis_url, tmp_path_factory):
    """A service with a window killed mid-stream after some checkpoints: its Redis namespace.
    With checkpoints due all the time and reads cut into minibatches (``adaptive`` batching for
    a 1 ms target; a read's first minibatch carries the read's rejects, so its span reaches over
    the others) a chunk is written per read."""
    namespace = f"snap{time.monotonic_ns() % 10**9}"
    tmp = tmp_path_factory.mktemp("snapshot")
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None).slice(0, 3000)
    t = ARRIVAL_EPOCH_MS + 1000 * pa.array(range(places.num_rows), pa.int64()).to_numpy()
    places = places.set_column(places.column_names.index("t"), "t", pa.array(t)).to_pylist()
    for q in pq.read_table(slice_queries).slice(0, 500).to_pylist():
        r.xadd(keys.ingest_queries, register_fields(q))
    bad = [{**places[i], "lon": 500.0} for i in range(0, 3000, 97)]  # rejected in the chunks' ranges
    entries = [x for i, p in enumerate(places) for x in ([p, bad[i // 97]] if i % 97 == 0 else [p])]
    proc = serve_process(redis_url, namespace, tmp / "serve.log", "--set", "serve.batch=100", "--window",
                         f"{WINDOW_MS // 1000}s",
                         "--set", f"serve.checkpoint_interval_s={request.param}",
                         *(["--set", "serve.latency_target_ms=1"] if request.param != "0.2" else []), workers=2)
    published: dict[str, str] = {}  # entry id -> its object's id
    try:
        for s in range(0, len(entries), 250):  # in pieces: checkpoints (and chunks) between them
            ids = publish_objects(r, keys, entries[s:s + 250])
            published.update(zip(ids, (e["id"] for e in entries[s:s + 250])))
            time.sleep(0.6)
        deadline = time.monotonic() + 120
        while (r.hlen(keys.serve_snapshot) < 2 or not r.hget(keys.serve_checkpoint, "trimmed_below")) \
                and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    return r, keys, published


def test_a_start_reads_from_the_chunks_what_the_whole_stream_gives(stopped_service):
    r, keys, published = stopped_service
    chunks = r.hgetall(keys.serve_snapshot)
    assert len(chunks) >= 2
    first_entry = r.xrange(keys.ingest_objects, count=1)[0][0]
    # The trim dropped every chunk whose entries it removed.
    assert all(entry_order(name) >= entry_order(first_entry) for name in chunks)
    with_chunks = _read(r, keys)
    r.delete(keys.serve_snapshot)
    try:
        parsed = _read(r, keys)
    finally:
        r.hset(keys.serve_snapshot, mapping=chunks)
    assert with_chunks.objects.num_rows > 1000
    _same(with_chunks, parsed)
    # Each chunk's rows are objects of its own range of entries, as published (a trim may have
    # removed the range's first entries since: a chunk leaves with the trim of its last).
    for value in chunks.values():
        c = decode(value, OBJECT_SCHEMA, DEFAULT_LIMITS)
        first, last = entry_order(c.first), entry_order(c.last)
        ids = {oid for eid, oid in published.items() if first <= entry_order(eid) <= last}
        assert set(c.objects.column("id").to_pylist()) <= ids


def test_a_chunk_a_client_tampered_with_is_left_out(stopped_service):
    r, keys, _ = stopped_service
    chunks = r.hgetall(keys.serve_snapshot)
    name, value = sorted(chunks.items(), key=lambda kv: entry_order(kv[0]))[1]
    c = decode(value, OBJECT_SCHEMA, DEFAULT_LIMITS)
    bad_lon = c.objects.set_column(1, "lon", pc.add(c.objects.column("lon"), 400.0))
    cases = {
        "garbage": "not base64 at all!",
        "point out of range": encode(type(c)(c.first, c.last, c.spans, bad_lon), DEFAULT_LIMITS),
        "other limits": encode(c, Limits(max_keywords=8)),
        # A zstd bomb: a stream claimed 2**40 bytes long is refused before any allocation.
        "bomb": base64.b64encode((1 << 40).to_bytes(8, "little") + base64.b64decode(value)[8:]).decode(),
    }
    parsed = None
    try:
        r.delete(keys.serve_snapshot)
        parsed = _read(r, keys)
        for tampered in cases.values():
            r.hset(keys.serve_snapshot, mapping={**chunks, name: tampered})
            _same(_read(r, keys), parsed)
        r.hset(keys.serve_snapshot, mapping={**chunks, "0-1": json.dumps({"x": 1}), "not an id": value})
        _same(_read(r, keys), parsed)
        # A chunk misnamed (claiming a later range than its rows) is not taken either.
        r.delete(keys.serve_snapshot)
        others = {k: v for k, v in chunks.items() if k != name}
        r.hset(keys.serve_snapshot, mapping={**others, "9999999999999-0": value})
        _same(_read(r, keys), parsed)
    finally:
        r.delete(keys.serve_snapshot)
        r.hset(keys.serve_snapshot, mapping=chunks)
    assert parsed is not None
