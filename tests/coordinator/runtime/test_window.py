"""Sliding windows: after every batch each result is the exact kNN over the live objects only
(the brute-force oracle restricted to them), on real places, with real Redis (and Ray)."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pyarrow as pa
import pytest

from knnmon.coordinator.runtime import routing_upkeep
from knnmon.workers import state as worker_state

from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.due_lists import DueTable

from knnmon.coordinator.recovery.reviver import Reviver

from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.runtime.preparation import with_arrival_times
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.oracle import BruteForceKnn
from knnmon.query import Query
from knnmon.store import StoreConfig
from tests.support import assert_exact, redis_results

SECOND = 1000


@pytest.fixture(scope="module")
def windowed(places_slice, slice_queries):
    """The slice's places in stream order, one per second, and 1,500 queries."""
    objects = with_arrival_times(stream_order(read_objects(str(places_slice)), None), SECOND)
    return str(places_slice), load_queries(str(slice_queries)).slice(0, 1500), objects


def live(objects: pa.Table, upto: int, window_ms: int) -> pa.Table:
    """The first ``upto`` objects' live ones at their watermark."""
    seen = objects.slice(0, upto)
    t = seen.column("t").to_numpy()
    return seen.filter(pa.array(t > t.max() - window_ms))


@pytest.mark.parametrize("executor, reserve", [("inline", 0), ("inline", 2),
                                               pytest.param("ray", None, marks=pytest.mark.slow)])  # (ray: 11 s)
def test_exact_after_every_batch_with_expiry_and_refill(windowed, executor, reserve, request, redis_url, namespace,
                                                         tmp_path, monkeypatch):
    """Without a reserve every expiry in a full result refills; with one (2, and the default 8)
    the next neighbour comes from the reserve until it runs out. With a reserve the routing table
    is rebuilt in the background after every batch that added regions (swapped in at the next
    batch, the refills' regions added meanwhile replayed): results stay exact throughout."""
    if executor == "ray":
        request.getfixturevalue("ray_instance")
    if reserve != 0:
        monkeypatch.setattr(routing_upkeep, "REBUILD_S", 0.0)
    monkeypatch.setattr(worker_state, "COMPACT_MIN", 64)  # in-process workers compact their handles often
    objects_dir, queries, objects = windowed
    window = 1500 * SECOND
    config = RunConfig(workers=3, initial=3000, batch=250, batches=12, executor=executor, window=window,
                       arrival_ms=SECOND, reserve=reserve, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    k = queries.column("k").to_numpy()
    below_k_then_full = set()
    was_below: set[str] = set()
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        assert rt.objects.initial_objects == 1500  # the initial objects older than the window are not live
        assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, 3000, window)))
        seen, refilled = 3000, 0
        for i, batch in enumerate(rt.batches()):
            if i == 6:  # announcements lost (a restarted service's): the lists come back short, refilled late
                rt.dispatcher.due = [DueTable() for _ in rt.dispatcher.due]
                late = rt.dispatcher.short_refills
            if i in (3, 9) and rt.upkeep.building:  # (a build finished: swapped in at the next batch)
                rt.upkeep._build.result()
            report = rt.process(batch)
            seen += batch.num_rows
            refilled += report.refilled
            assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
            sizes = [len(r) for r in redis_results(redis_url, namespace, queries.column("id").to_pylist())]
            for qid, n, kk in zip(queries.column("id").to_pylist(), sizes, k.tolist()):
                if n < kk:
                    was_below.add(qid)
                elif qid in was_below:
                    below_k_then_full.add(qid)
        if executor == "inline":  # the expired objects' handles (and details) are compacted away
            for w in rt.pool.workers:
                held = len(np.unique(w.state.lists.h[w.state.lists.h >= 0]))
                assert w.state.handles.live and len(w.state.handles) <= 2 * held + 64, (len(w.state.handles), held)
        assert len(rt.objects) == 1500  # the coordinator keeps the live objects only
        assert rt.prepared is None  # (nor the initial objects apart from its parts, expired long ago)
        with pytest.raises(RuntimeError, match="before the stream starts"):
            rt.objects.initial_info(np.arange(3))
        assert len(rt.dispatcher.seen) <= 1500 + 10_000 + 250  # ids forgotten as their objects expire
        rebuilds = rt.upkeep.rebuilds
        short = rt.dispatcher.short_refills
    assert refilled > 100
    # Refills go with the batch that needs them, announced; short ones after the start and the loss.
    assert 0 < short < refilled / 2 and short > late
    assert rebuilds >= (2 if reserve != 0 else 0)
    assert below_k_then_full  # results shrank below k when objects expired, and filled again


def test_late_objects_are_counted_not_applied(windowed, redis_url, namespace, tmp_path):
    objects_dir, queries, objects = windowed
    window = 1000 * SECOND
    config = RunConfig(workers=2, initial=3000, batch=250, batches=1, executor="inline", window=window,
                       arrival_ms=SECOND, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        fresh = objects.slice(3000, 200)
        old = objects.slice(0, 50)  # ids never seen by this run's window (the first 2,000 expired)
        t = old.column("t").to_numpy()
        stale = old.set_column(old.column_names.index("t"), "t", pa.array(t, type=pa.int64()))
        report = rt.process(pa.concat_tables([fresh, stale.select(fresh.column_names)]))
        assert report.late == 50 and report.objects == 200
        assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, 3200, window)))


def test_an_unregistered_querys_routing_entries_are_gone(windowed, redis_url, namespace, tmp_path):
    """After a rebuild (due once a tenth of the queries were unregistered), an object with a
    keyword only the unregistered queries had reaches no worker; registered ones still route."""
    objects_dir, queries, objects = windowed
    config = RunConfig(workers=2, initial=3000, batch=250, batches=2, executor="inline", window=1000 * SECOND,
                       arrival_ms=SECOND, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    from knnmon.query import Query

    with Runtime(objects_dir, queries.slice(0, 10), config, reviver=Reviver) as rt:
        at = objects.slice(2999, 1).to_pylist()[0]
        rt.registrar.register([Query.create("only", at["lon"], at["lat"], ["zzqonly"], 3)])
        routing = rt.dispatcher.routing

        def route(word: str, lon: float, lat: float) -> int:
            kw = pa.array([[word]], pa.list_(pa.string()))
            return int(routing.route_objects(np.array([lon]), np.array([lat]), kw)[0])

        q0 = queries.slice(0, 1).to_pylist()[0]
        kept = (q0["keywords"][0], q0["lon"], q0["lat"])  # a registered query's keyword at its location
        assert route("zzqonly", at["lon"], at["lat"]) != 0 and route(*kept) != 0
        rt.registrar.unregister("only")
        rt.upkeep_routing()  # 1 of 11 queries unregistered: due, the build starts in the background
        assert rt.upkeep.building
        # a region added while the build runs (after its snapshot) is replayed into the fresh table
        rt.registrar.register([Query.create("meanwhile", at["lon"], at["lat"], ["zzqmeanwhile"], 3)])
        deadline = time.monotonic() + 60
        while rt.upkeep.building and time.monotonic() < deadline:
            time.sleep(0.01)
            rt.upkeep_routing()
        assert rt.upkeep.rebuilds == 1
        assert route("zzqonly", at["lon"], at["lat"]) == 0  # gone with its query
        assert route("zzqmeanwhile", at["lon"], at["lat"]) != 0  # not lost by the swap
        assert route(*kept) != 0
        rt.registrar.unregister("meanwhile")
        for batch in rt.batches():
            rt.process(batch)
        assert_exact(redis_url, namespace, queries.slice(0, 10),
                     BruteForceKnn(live(objects, 3000 + 2 * 250, 1000 * SECOND)))


@pytest.mark.slow  # 9 s each; the model-based test revives windowed workers from Redis (in process)
@pytest.mark.parametrize("details_lost", [False, True])
def test_a_windowed_ray_worker_lost_between_batches_is_revived_from_redis(windowed, ray_instance, redis_url,
                                                                         namespace, tmp_path, monkeypatch,
                                                                         details_lost):
    """With a window Redis lacks the reserves beyond k, but between batches it holds exactly
    what the worker applied: a worker found lost by a registration is loaded with each result
    as Redis holds it, its kNN radius the k-th distance and its members' times from its details
    hash (no search), a chunk of queries at a time while the next is read, and stays exact
    through the expiries and refills after. With a member's details gone from its hash (in the
    last chunk read, after the first chunks were loaded), the worker is started again and its
    lists are rebuilt over the live objects instead: exact too."""
    import os
    import signal

    import redis

    from knnmon.coordinator.recovery import revival
    from knnmon.keys import Keys

    monkeypatch.setattr(revival, "CHUNK", 100)  # (several chunks)
    objects_dir, queries, objects = windowed
    window = 1500 * SECOND
    config = RunConfig(workers=2, initial=3000, batch=250, batches=12, window=window, arrival_ms=SECOND, reserve=2,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        batches = list(rt.batches())
        for b in batches[:4]:
            rt.process(b)
        reg = rt.registrar
        probe = objects.slice(3900, 1).to_pylist()[0]
        late = Query.create("late", probe["lon"], probe["lat"], probe["keywords"][:2], 5)
        w = reg.place(late.lon, late.lat)
        pid = {s.worker: s.pid for s in reg.stats()}[w]
        mine = [q for q, x in reg.query_worker.items() if x == w]
        assert len(mine) > 300
        if details_lost:  # a member of a result in the last chunk loses its details
            client = redis.Redis.from_url(redis_url, decode_responses=True)
            keys = Keys(namespace)
            member = next(m for q in reversed(mine) for m in client.zrange(keys.result(q), 0, 0))
            assert sum(client.hdel(h, member) for h in client.keys(f"{namespace}:objects:{w}*")) == 1
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # until the process is gone
            try:
                os.kill(pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        assert reg.register([late]) == [w] and rt.workers_revived == 1
        seen = 3000 + 4 * 250
        everyone = pa.concat_tables([queries, pa.Table.from_pylist(
            [{"id": "late", "lon": late.lon, "lat": late.lat, "keywords": list(late.keywords), "k": late.k}],
            schema=queries.schema)])
        oracle = BruteForceKnn(live(objects, seen, window))
        assert_exact(redis_url, namespace, everyone, oracle)
        # The revived worker's lists are the results Redis held: each kNN radius is the distance of
        # the k-th live match (inf with fewer); the reserve comes back with the next refill.
        held, radii = rt.pool.gather([rt.pool.regions(w)])[0]
        held = held.to_pylist()
        checked = 0
        for i in range(0, len(held), 7):
            q = held[i]
            if q["id"] == "late" or details_lost:  # its k + reserve nearest (searched)
                continue
            want = oracle.knn(q["lon"], q["lat"], q["keywords"], q["k"])
            assert radii[i] == (want[-1][1] if len(want) == q["k"] else np.inf), q["id"]
            checked += len(want) == q["k"]
        assert checked > 10 or details_lost
        assert "details" in rt.reviver.seconds[-1] and ("search" in rt.reviver.seconds[-1]) == details_lost
        for b in batches[4:]:
            rt.process(b)
            seen += b.num_rows
            assert_exact(redis_url, namespace, everyone, BruteForceKnn(live(objects, seen, window)))
        assert pid not in [s.pid for s in reg.stats()]


@contextlib.contextmanager
def _past_three_batches(windowed, workers: int, batches: int, store: StoreConfig):
    """A windowed Ray run (window 1,500 s, reserve 2) after its first 3 batches: the runtime,
    all its batches and the objects seen so far."""
    objects_dir, queries, _ = windowed
    config = RunConfig(workers=workers, initial=3000, batch=250, batches=batches, window=1500 * SECOND,
                       arrival_ms=SECOND, reserve=2, store=store)
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        every = list(rt.batches())
        for b in every[:3]:
            rt.process(b)
        yield rt, every, 3000 + sum(b.num_rows for b in every[:3])


def _kill(pid: int) -> None:
    """SIGKILL a worker process and wait until it is gone."""
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            return


@pytest.mark.slow  # 16 s; the model-based test loses a worker during a windowed batch (in process)
def test_a_windowed_ray_worker_lost_during_a_batch_is_rebuilt_over_the_live_objects(windowed, ray_instance, redis_url,
                                                                                   namespace, tmp_path):
    """A worker lost before a batch (found at the batch's expiry) is loaded from Redis and takes
    the batch; one lost while the batch runs is loaded from Redis and the batch replayed on it
    (its expiry, its refills searched without the batch's own objects, its objects); one lost
    while the batch runs whose details hash lacks a member is rebuilt over the live objects,
    which hold the batch, and Redis repaired to them in one write at the batch's version. Every
    result is exact after that batch and the ones after; the change feed replays to every
    result, no change applied twice; each details hash holds exactly its results' objects; no
    other worker is replaced."""
    from collections import deque

    import redis

    from knnmon.keys import Keys
    from tests.support import assert_feed_and_objects

    _, queries, objects = windowed
    window = 1500 * SECOND
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    qids = queries.column("id").to_pylist()
    with _past_three_batches(windowed, 2, 12, StoreConfig(redis_url, namespace, str(tmp_path))) as (rt, batches, seen):
        pids = {s.worker: s.pid for s in rt.registrar.stats()}
        _kill(pids[0])  # found lost by the next batch's expiry
        report = rt.process(batches[3])
        seen += batches[3].num_rows
        assert rt.workers_revived == 1 and report.batch == 3 and "search" not in rt.reviver.seconds[-1]
        assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
        assert_feed_and_objects(r, Keys(namespace), qids)
        for number, spoil in ((4, False), (5, True)):  # lost while the batch runs
            victim = 5 - number  # worker 1, then worker 0 again
            pid = {s.worker: s.pid for s in rt.registrar.stats()}[victim]
            d = rt.dispatcher.dispatch(batches[number])
            _kill(pid)
            if spoil:  # a member's details missing: rebuilt over the live objects instead
                key = Keys(namespace).objects(victim)
                r.hdel(key, next(iter(r.hkeys(key))))
            rt.reviver.collect(d, deque())
            seen += batches[number].num_rows
            assert rt.workers_revived == number - 2
            assert ("search" in rt.reviver.seconds[-1]) == spoil, rt.reviver.seconds[-1]
            assert pid not in [s.pid for s in rt.registrar.stats()]
            assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
            assert_feed_and_objects(r, Keys(namespace), qids)
        for b in batches[6:]:
            rt.process(b)
            seen += b.num_rows
            assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
        assert_feed_and_objects(r, Keys(namespace), qids)
        assert rt.workers_revived == 3


@pytest.mark.parametrize("lost", [pytest.param("none", marks=pytest.mark.slow), "both"])  # (none: 8 s)
def test_a_worker_lost_during_a_move_is_revived_in_place(windowed, ray_instance, redis_url, namespace, tmp_path, lost):
    """A re-balancing move (:func:`~knnmon.coordinator.rebalance.migration.migrate`) between
    batches of a windowed Ray run with a reserve, whose source and target die before their
    calls: each is revived in place from Redis and its step done again (no other worker
    replaced, nothing rebuilt). With or without the losses the moved queries end on the target,
    every query on exactly one worker, and every result exact in the batches after, against the
    oracle over the live objects (a moved list short of its reserve keeps its source's radius:
    it had been taken as complete, and missed its refills)."""
    import redis

    from knnmon.coordinator.rebalance.migration import migrate
    from knnmon.coordinator.rebalance.planner import Move
    from knnmon.keys import Keys
    from tests.support import assert_feed_and_objects

    _, queries, objects = windowed
    window = 1500 * SECOND
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    qids = queries.column("id").to_pylist()
    with _past_three_batches(windowed, 3, 8, StoreConfig(redis_url, namespace, str(tmp_path))) as (rt, batches, seen):
        on = rt.registrar.query_worker
        moving = [q for q in qids if on[q] == 0][:120]
        pids = {s.worker: s.pid for s in rt.registrar.stats()}
        victims = {"none": [], "both": [0, 1]}[lost]  # both: the source at its export, the target at its adoption
        for w in victims:
            _kill(pids[w])
        migrate(rt.pool, rt.registrar, [Move(moving, 0, 1, 0.0, "test")], revive=lambda w: rt.revive_idle(w) is not None)
        assert rt.workers_revived == len(victims)
        now = {s.worker: s.pid for s in rt.registrar.stats()}
        assert [w for w in range(3) if now[w] != pids[w]] == victims  # the others kept their process
        assert all(rt.registrar.query_worker[q] == 1 for q in moving)
        assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
        for b in batches[3:]:
            rt.process(b)
            seen += b.num_rows
            assert_exact(redis_url, namespace, queries, BruteForceKnn(live(objects, seen, window)))
        held = rt.pool.gather([rt.pool.query_loads(w) for w in range(3)])
        assert sorted(q for ids, *_ in held for q in ids) == sorted(qids)  # every query on exactly one worker
        assert set(moving) <= set(held[1][0])
        assert_feed_and_objects(r, Keys(namespace), qids)
