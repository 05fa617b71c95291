"""Poison isolation: an entry that makes knnmon fail at any stage is rejected as
``internal_error``; the service stays up and every other entry of its read is applied exactly.

The failures are injected (no valid entry triggers one); the service runs in this process with
in-process workers, against the real Redis, and is checked against the brute-force oracle.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.service import intake
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.store import StoreConfig
from tests.support import assert_applied_once, assert_exact, publish_objects, register_fields
from knnmon.workers.result_writer import ResultWriter
from knnmon.workers.worker import KnnWorker


def _fail_when(monkeypatch, owner, name: str, poisoned) -> None:
    """``owner.name`` raises ``RuntimeError`` (or what ``poisoned`` returns) when
    ``poisoned(*args)`` is true."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        bad = poisoned(*args, **kwargs)
        if bad:
            raise bad if isinstance(bad, BaseException) else RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_an_entry_failing_at_any_stage_is_rejected_and_the_rest_is_applied(places_slice, slice_queries, redis_url,
                                                                           namespace, monkeypatch):
    places = stream_order(read_objects(str(places_slice)), None).slice(0, 2500).to_pylist()
    queries = pq.read_table(slice_queries).slice(0, 60).to_pylist()
    q0 = queries[0]
    # A stage each: parsing, the initial kNN, placement (queries); a worker, the Redis write (objects).
    poison_queries = [{**q0, "id": "poison-knn", "keywords": ["poisonknn"]},
                      {**q0, "id": "poison-place", "lon": 12.345, "lat": 1.0}]
    poison_objects = [{**places[5], "id": "poison-parse"}, {**places[6], "id": "poison-worker"},
                      {**places[7], "id": "poison-write", "lon": q0["lon"], "lat": q0["lat"], "keywords": q0["keywords"]}]
    _fail_when(monkeypatch, intake, "parse_objects", lambda entries, *a, **kw: any(
        f.get("id") == "poison-parse" for _, f in entries))
    _fail_when(monkeypatch, ObjectStore, "knn_v", lambda self, lon, lat, kws, k: any("poisonknn" in w for w in kws))
    _fail_when(monkeypatch, Registrar, "place", lambda self, lon, lat: lon == 12.345)
    _fail_when(monkeypatch, KnnWorker, "process_rows", lambda self, batch, rows=None, **kw:
               "poison-worker" in batch.table.column("id").take(
                   pa.array(batch.rows_of(self.state.worker_id) if rows is None else rows)).to_pylist())
    _fail_when(monkeypatch, ResultWriter, "write_batch",
               lambda self, tag, changes: redis.ResponseError("ERR injected") if "poison-write" in changes.entered
               else None)

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    for q in queries[:30] + poison_queries + queries[30:]:
        r.xadd(keys.ingest_queries, register_fields(q))
    publish_objects(r, keys, places[:1000] + poison_objects + places[1000:])
    run = RunConfig(workers=2, executor="inline", store=StoreConfig(url=redis_url, namespace=namespace), batch=500)
    config = ServeConfig(run=run, max_delay_ms=5, block_ms=50)
    with Service(config) as svc:
        counters = svc.run(idle_exit_s=1.0, handle_signals=False)
    rejects = {f["id"]: f for _, f in r.xrange(keys.ingest_rejects)}
    assert set(rejects) == {"poison-knn", "poison-place", "poison-parse", "poison-worker", "poison-write"}
    assert all(f["_reason"] == "internal_error" and "injected" in f["_detail"] for f in rejects.values())
    assert counters["internal_errors"] == 5 and counters["isolations"] >= 1
    # Everything else was applied, exactly once: results equal the oracle over the other objects.
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), BruteForceKnn(pa.Table.from_pylist(places))) == 60
    assert r.scard(keys.queries) == 60
    for key in (keys.ingest_objects, keys.ingest_queries):
        assert r.xpending(key, "knnmon")["pending"] == 0
    assert_applied_once(r, keys)  # nothing written twice

