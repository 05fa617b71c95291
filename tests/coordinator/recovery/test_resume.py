"""A restart that starts every worker from the results Redis holds (coordinator/recovery/resume.py,
coordinator/recovery/stored_start.py): exact after a stop in the middle of a batch that some
workers had written and others had not, with and without a window; a full recovery when the
settings changed or Redis lacks a member's details. The service runs in this process with
in-process workers, against the real Redis, checked against the brute-force oracle on real places.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS, RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.coordinator.recovery.resume import settings_of, why_not_resumable
from tests.support import assert_applied_once, assert_exact, publish_objects, register_fields
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.protocol import GROUP
from knnmon.store import StoreConfig
from knnmon.workers.worker import KnnWorker

WINDOW_MS = 1_200_000  # 1,200 places at one a second


class _Crash(BaseException):
    """The service dies here (not an error it handles: it leaves run() as SIGKILL would)."""


def _config(redis_url: str, namespace: str, window: int | None, workers: int = 3) -> ServeConfig:
    run = RunConfig(workers=workers, executor="inline", store=StoreConfig(url=redis_url, namespace=namespace),
                    batch=200, window=window)
    return ServeConfig(run=run, max_delay_ms=5, block_ms=50)


def _places(places_slice, n: int) -> list[dict]:
    places = stream_order(read_objects(str(places_slice)), None).slice(0, n)
    t = ARRIVAL_EPOCH_MS + 1000 * pa.array(range(places.num_rows), pa.int64()).to_numpy()  # one a second
    return places.set_column(places.column_names.index("t"), "t", pa.array(t)).to_pylist()


def _crash_in_a_batch(monkeypatch, oid: str, worker: int) -> None:
    """The stream batch holding object ``oid`` is written by the workers before ``worker``, then
    the service dies."""
    original = KnnWorker.process_rows

    def process_rows(self, batch, rows=None, **kw):
        if self.state.worker_id == worker and oid in batch.table.column("id").to_pylist():
            raise _Crash()
        return original(self, batch, rows, **kw)

    monkeypatch.setattr(KnnWorker, "process_rows", process_rows)


@pytest.mark.parametrize("window", [None, WINDOW_MS], ids=["append-only", "window"])
def test_a_restart_mid_batch_resumes_exactly_from_the_stored_results(places_slice, slice_queries, redis_url,
                                                                     namespace, monkeypatch, window):
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    places = _places(places_slice, 2400)
    queries = pq.read_table(slice_queries).slice(0, 400).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    publish_objects(r, keys, places)
    config = _config(redis_url, namespace, window)
    _crash_in_a_batch(monkeypatch, places[1500]["id"], worker=2)
    with Service(config) as svc, pytest.raises(_Crash):
        svc.run(idle_exit_s=0.5, handle_signals=False)
    applied_before = svc.counters["objects"]
    monkeypatch.undo()
    pending = {x["message_id"] for x in r.xpending_range(keys.ingest_objects, GROUP, "-", "+", 10_000)}
    pending_ids = {f["id"] for eid, f in r.xrange(keys.ingest_objects) if eid in pending}
    assert len(pending_ids) >= 200
    # Worker 0 wrote the batch: some of its results hold objects the service never acknowledged.
    on_0 = [q["id"] for q in queries if r.hget(keys.query(q["id"]), "worker") == "0"]
    assert any(pending_ids.intersection(r.zrange(keys.result(qid), 0, -1)) for qid in on_0)
    assert why_not_resumable(r, keys, settings_of(config, 0), frozenset()) is None
    with Service(config) as svc:
        assert svc.runtime.timings["replayed"] >= 200  # no search, no reconcile
        svc.run(idle_exit_s=0.5, handle_signals=False)
    # Each object counted as applied once: those the restart's recovery applied too (found by
    # the model-based test: a rebuild's objects were missing from the counter).
    assert applied_before + svc.counters["objects"] == len(places)
    applied = pa.Table.from_pylist(places)
    if window is not None:
        applied = applied.filter(pa.array(applied.column("t").to_numpy() > places[-1]["t"] - WINDOW_MS))
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), BruteForceKnn(applied)) == 400
    assert not r.xpending(keys.ingest_objects, GROUP)["pending"]
    assert_applied_once(r, keys)


def test_a_restart_recovers_in_full_when_the_settings_changed_or_details_are_missing(
        places_slice, slice_queries, redis_url, namespace):
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    places = _places(places_slice, 1600)
    queries = pq.read_table(slice_queries).slice(0, 300).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    publish_objects(r, keys, places[:800])
    with Service(_config(redis_url, namespace, WINDOW_MS)) as svc:
        svc.run(idle_exit_s=0.5, handle_signals=False)
    config = _config(redis_url, namespace, WINDOW_MS, workers=2)
    assert why_not_resumable(r, keys, settings_of(config, 0), frozenset()) == "the settings changed (workers)"
    with Service(config) as svc:  # two workers now: every query placed anew
        assert "replayed" not in svc.runtime.timings
    # Redis lost a member's details: the start from the stored results gives up before loading.
    details = keys.objects(0)
    r.hdel(details, next(iter(r.hkeys(details))))
    publish_objects(r, keys, places[800:])
    with Service(config) as svc:
        assert "replayed" not in svc.runtime.timings
        svc.run(idle_exit_s=0.5, handle_signals=False)
    with Service(config) as svc:  # and the next start resumes again
        assert "replayed" in svc.runtime.timings
    with Service(replace(config, replan=True)) as svc:  # serve serve.replan: planned anew
        assert "replayed" not in svc.runtime.timings
    live = pa.Table.from_pylist(places)
    live = live.filter(pa.array(live.column("t").to_numpy() > places[-1]["t"] - WINDOW_MS))
    assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries), BruteForceKnn(live)) == 300


def test_why_not_resumable_names_each_reason(redis_url, namespace):
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    config = _config(redis_url, namespace, WINDOW_MS, workers=2)
    settings = settings_of(config, 0)
    assert why_not_resumable(r, keys, settings, frozenset()) == "no settings recorded"
    r.hset(keys.serve_settings, mapping=settings)
    assert why_not_resumable(r, keys, settings, frozenset()) is None
    assert why_not_resumable(r, keys, settings, frozenset({"1-0"})) == "entries are being isolated"
    assert why_not_resumable(r, keys, {**settings, "reserve": "9"}, frozenset()) == "the settings changed (reserve)"


def test_a_placement_a_client_wrote_into_a_query_hash_means_a_full_recovery_never_a_crash():
    """The ``worker`` and ``set`` fields come from Redis: any value a client wrote there."""
    from knnmon.coordinator.recovery.resume import stored_start
    from knnmon.query import Query

    q = Query("q1", 7.0, 45.0, ("cafe",), 3)
    for worker in ("9" * 30, "-1", "2", "", "x", "١", None):
        stored, why = stored_start([q], {"q1": (worker, None, None, False)}, 2, None, 5)
        assert stored is None and "no worker among the 2" in why, worker
    stored, why = stored_start([q], {"q1": ("1", None, "9" * 30, False)}, 2, None, 5)
    assert why is None and stored.worker.tolist() == [1] and stored.set_of.tolist() == [-1]  # an unknown set
    stored, why = stored_start([q], {"q1": ("1", None, None, True)}, 2, None, 5)
    assert stored is None and "move noted" in why


def test_a_plan_record_a_client_wrote_is_dropped_not_trusted(redis_url, namespace):
    """``knn:plan``'s sets place new registrations: a record naming no real worker or region is
    left out (the start places by load alone), never indexed with."""
    import json

    import numpy as np

    from knnmon.coordinator.recovery.stored_start import _recorded_sets

    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    good = {"worker": 1, "queries": 1, "work": 2.0, "region": [0, 0, 1, 1], "history": ["split by x"]}
    r.hset(keys.plan, "set:0", json.dumps(good))
    sets, on = _recorded_sets(redis_url, namespace, np.array([0, -1]), 2)
    assert on.tolist() == [1] and sets[0].members.tolist() == [0] and sets[0].region == (0.0, 0.0, 1.0, 1.0)
    for bad in ({**good, "worker": 2}, {**good, "worker": -2}, {**good, "worker": 10 ** 30}, {**good, "region": [1]},
                {**good, "work": "x"}, {"worker": 1}, [1, 2], "not json"):
        r.hset(keys.plan, "set:0", bad if isinstance(bad, str) else json.dumps(bad))
        assert _recorded_sets(redis_url, namespace, np.array([0, -1]), 2)[0] == [], bad


def test_a_kept_start_reads_each_query_set_as_a_placement_number(redis_url, namespace):
    """A kept start reads the queries' ``set`` fields in one script call per chunk: a field any
    client wrote reads as :func:`placement_number` reads it (``-1``: none), never indexes."""
    from knnmon.coordinator.recovery.kept_start import _sets
    from knnmon.workers.placements import placement_number

    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    fields = ["0", "7", " 12 ", "2147483647", "2147483648", "99999999999999999999", "-3", "1.5", "junk", "", "\u0661"]
    for i, v in enumerate(fields):
        r.hset(keys.query(f"q{i}"), "set", v)
    ids = [f"q{i}" for i in range(len(fields))] + ["absent"]
    expected = [n if n is not None and n < 2 ** 31 else -1 for n in map(placement_number, fields)] + [-1]
    assert _sets(r, keys, ids, chunk=4).tolist() == expected == [0, 7, 12, 2147483647] + [-1] * 8


def test_the_feed_version_is_the_largest_readable_one_among_the_last_entries(redis_url, namespace, caplog):
    """A restart continues the change feed's versions from the largest of its last entries, read by
    a script; an entry any client wrote with an unreadable version is left out and counted."""
    from knnmon.coordinator.recovery.rebuild import feed_version

    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    assert feed_version(r, keys) == 0
    for v in ("3", "12", "x", None, " 7 ", "99999999999999999999", "-40"):
        r.xadd(keys.changes, {"query": "q"} if v is None else {"query": "q", "version": v})
    with caplog.at_level("WARNING"):
        assert feed_version(r, keys) == 12
    assert "3 change feed entries with an unreadable version" in caplog.text
    assert feed_version(r, keys, last=3) == 7
