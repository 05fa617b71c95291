"""The worker's holder counts against Redis: after any sequence of batches, registrations,
unregisters, hand-overs and compactions, each details hash holds exactly the objects of the
results written on it, with their details, and every count equals the results holding the
object (standalone Redis and a 3-master cluster; with and without a reserve)."""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import knnmon.workers.state as worker_state
from knnmon.batch import ObjectInfo
from knnmon.connection import connect
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.query import QueryColumns
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings
from tests.workers.test_worker_memory import WORDS, _objects

def _details(table: pa.Table) -> dict[str, ObjectInfo]:
    return {oid: ObjectInfo(lon, lat, t, kw) for oid, lon, lat, t, kw in
            zip(*(table.column(c).to_pylist() for c in ("id", "lon", "lat", "t", "keywords")))}


def _check(w: KnnWorker, client, details: dict[str, ObjectInfo]) -> None:
    """Redis's details hashes of ``w`` and its counts equal what its live results hold."""
    want_hash: dict[str, set[str]] = {}
    want_count: Counter = Counter()
    for s in np.flatnonzero(w.state.queries.alive).tolist():
        qid = w.state.queries.ids[s]
        members = [o for o, _ in w.state.result_row(s)]
        assert client.zrange(Keys(w.state.writer.keys.namespace).result(qid), 0, -1) == sorted(
            members, key=lambda o: (dict(w.state.result_row(s))[o], o))
        want_hash.setdefault(w.state.writer.details_key(qid), set()).update(members)
        want_count.update(members)
    writer = w.state.writer  # every details hash the worker can write: one per master (one standalone)
    hashes = [writer.bucket_key(b) for b in (writer.masters.names if writer.masters is not None else [""])]
    got = {k: set(client.hkeys(k)) for k in hashes if client.hlen(k)}
    assert got == {k: v for k, v in want_hash.items() if v}
    for key, oids in got.items():
        for oid in oids:
            assert ObjectInfo.from_text(client.hget(key, oid)) == details[oid]
    n = w.state.holders.by_handle()
    assert dict(zip(w.state.handles.names(np.flatnonzero(n)), n[np.flatnonzero(n)].tolist())) == dict(want_count)


@pytest.mark.parametrize("reserve", [0, 2])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1),
       steps=st.lists(st.sampled_from(["batch", "batch", "register", "unregister", "handover"]),
                      min_size=3, max_size=10))
def test_details_hashes_follow_the_results(store_url, reserve, seed, steps):
    rng = np.random.default_rng(seed)
    namespace = f"h{uuid.uuid4().hex[:10]}"  # (hypothesis repeats seeds while it shrinks)
    original = worker_state.COMPACT_MIN
    worker_state.COMPACT_MIN = 8  # compact often
    client = connect(store_url)
    w = other = None
    try:
        w = KnnWorker(0, WorkerSettings(store_url, namespace, reserve=reserve))
        other = KnnWorker(1, WorkerSettings(store_url, namespace, reserve=reserve))
        seen = _objects(rng, 30, 0)
        details = _details(seen)
        live: list[str] = []
        made, start = 0, 30

        def register(n: int) -> None:
            nonlocal made
            names = [f"q{made + i}" for i in range(n)]
            made += n
            q = QueryColumns(names, rng.integers(-30, 31, n) * 0.001, rng.integers(-30, 31, n) * 0.001,
                             [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(n)],
                             rng.integers(1, 5, n))
            oracle = BruteForceKnn(seen)
            topk = [oracle.knn(q.lon[i], q.lat[i], q.keywords[i], int(q.k[i]) + reserve) for i in range(n)]
            w.register_queries(q, topk, details)
            live.extend(names)

        register(10)
        _check(w, client, details)
        for b, step in enumerate(steps):
            if step == "batch":
                batch = _objects(rng, 20, start)
                start += 20
                seen = pa.concat_tables([seen, batch])
                details.update(_details(batch))
                w.process_batch(b, batch.column("id").to_pylist(), batch.column("lon").to_numpy(),
                                batch.column("lat").to_numpy(), batch.column("t").to_numpy(),
                                batch.column("keywords").to_pylist())
            elif step == "register":
                register(3)
            elif step == "handover":  # half the queries to the other worker and back
                names = live[::2]
                other.adopt_queries(w.export_queries(names))
                w.release_handed()
                _check(w, client, details)
                _check(other, client, details)
                w.adopt_queries(other.export_queries(names))
                other.release_handed()
                _check(other, client, details)
            elif live:
                for name in live[: max(1, len(live) // 2)]:
                    assert w.unregister_query(name)
                live[: max(1, len(live) // 2)] = []
            _check(w, client, details)
    finally:
        worker_state.COMPACT_MIN = original
        for worker in (w, other):
            if worker is not None:
                worker.state.writer.close()
        client.close()


def test_a_worker_rebuilt_from_redis_counts_what_redis_holds(redis_url, namespace):
    """A worker loaded with ``write=False`` (revived, or a service resuming) counts the holders
    of the results Redis holds, so its next batch writes and deletes the right details."""
    rng = np.random.default_rng(3)
    seen = _objects(rng, 40, 0)
    details, oracle = _details(seen), BruteForceKnn(seen)
    q = QueryColumns([f"q{i}" for i in range(8)], rng.integers(-30, 31, 8) * 0.001,
                     rng.integers(-30, 31, 8) * 0.001, [["cafe"]] * 8, rng.integers(1, 4, 8))
    topk = [oracle.knn(q.lon[i], q.lat[i], q.keywords[i], int(q.k[i])) for i in range(8)]
    first = KnnWorker(0, WorkerSettings(redis_url, namespace))
    first.load_queries(q, topk, details)
    first.state.writer.close()
    client = connect(redis_url)
    client.delete(Keys(namespace).objects(0))  # the details are written again on request
    w = KnnWorker(0, WorkerSettings(redis_url, namespace))
    w.load_queries(q, topk, details, write=False, details=True)
    _check(w, client, details)
    batch = _objects(rng, 30, 40)
    details.update(_details(batch))
    w.process_batch(0, batch.column("id").to_pylist(), batch.column("lon").to_numpy(),
                    batch.column("lat").to_numpy(), batch.column("t").to_numpy(), batch.column("keywords").to_pylist())
    _check(w, client, details)
    w.state.writer.close()
    client.close()
