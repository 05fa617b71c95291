"""The distributed runtime end to end: real Spark ingest, real Ray actors, real Redis, brute-force oracle."""

from __future__ import annotations

import contextlib
import json
from collections import deque

import numpy as np
import psutil
import pyarrow as pa
import pytest

from knnmon.connection import connect
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.recovery.reviver import Reviver
from knnmon.coordinator.runtime.routing_upkeep import BUILD_NICE
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.errors import InvalidQueryError, WorkerLostError
from knnmon.ingest.jobs import ingest_places
from knnmon.ingest.queries import QueryWorkload, generate_queries
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.query import Query
from knnmon.store import StoreConfig
from tests.support import assert_applied_once, assert_exact, expected, head_lines


@pytest.fixture(params=["ray", "inline"])
def executor(request):
    """Each runtime test runs with Ray actors and with in-process workers."""
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    return request.param


@pytest.fixture(scope="module", params=["ri", pytest.param("ct", marks=pytest.mark.slow)])
def ct(request, spark, tmp_path_factory):
    """Real places, queries drawn from them, the oracle over all, and the objects seen before the
    stream: all of Rhode Island's (the package's sample; 50,000 places, 5,000 queries, 25,000
    initial), or with ``-m slow`` 110,000 of Connecticut's (``../shared/data``; 10,000 queries,
    50,000 initial)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "ri":
        lines, least, initial, n = request.getfixturevalue("place_lines")("ri", 54_975), 50_000, 25_000, 5_000
    else:
        shared = request.getfixturevalue("shared_data")
        lines, least, initial, n = (head_lines(shared / "places" / "places-us-ct.geojson.gz", 110_500), 100_000,
                                    50_000, 10_000)
    (root / "in.geojson").write_text("\n".join(lines) + "\n")
    ingest_places([str(root / "in.geojson")], str(root / "objects"))
    objects = read_objects(str(root / "objects"))
    queries = generate_queries(objects, QueryWorkload(n=n, k_max=10, seed=11))
    assert objects.num_rows >= least
    return str(root / "objects"), queries, expected(queries, BruteForceKnn(objects)), objects.num_rows, initial


@pytest.mark.parametrize("algorithm, executor, index", [
    # (keyword, space and random: -m slow; the default suite runs them exact through the small
    # bench, test_bench.py, on Ray workers and real places)
    ("proposed", "ray", "grid"), pytest.param("keyword", "ray", "grid", marks=pytest.mark.slow),
    pytest.param("space", "ray", "grid", marks=pytest.mark.slow),
    pytest.param("random", "ray", "grid", marks=pytest.mark.slow),
    ("proposed", "inline", "grid"), pytest.param("proposed", "ray", "rtree", marks=pytest.mark.slow)])
# (rtree on Ray: -m slow, 8 s; the R-tree is exact on real places in the service in test_batching.py)
def test_every_result_is_exact_on_real_places(ct, ray_instance, redis_url, namespace, algorithm, executor, index,
                                              tmp_path):
    objects_dir, queries, want, n_objects, initial = ct
    config = RunConfig(workers=4, algorithm=algorithm, initial=initial, batch=1000, executor=executor, index=index,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        summary = rt.run(progress=False)
        assert summary.objects + summary.initial_objects == n_objects
        assert summary.results_changed > 1000 and summary.deliveries_per_object > 0
        assert assert_exact(redis_url, namespace, queries, want) == queries.num_rows


@pytest.mark.parametrize("executor", ["ray", pytest.param("inline", marks=pytest.mark.slow)])  # (inline: 14 s)
def test_a_load_in_parts_gives_each_worker_only_its_keywords_and_stays_exact(ct, ray_instance, redis_url, namespace,
                                                                          executor, tmp_path, monkeypatch):
    from knnmon.coordinator.runtime import registration

    monkeypatch.setattr(registration, "LOAD_CHUNK", 700)  # 5,000 or 10,000 queries on 4 workers: 2-4 parts each
    objects_dir, queries, want, _, initial = ct
    config = RunConfig(workers=4, algorithm="proposed", initial=initial, batch=1000, batches=20, executor=executor,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        rt.run(progress=False)
        words = [set() for _ in range(4)]
        for qid, kws in zip(queries.column("id").to_pylist(), queries.column("keywords").to_pylist()):
            words[rt.registrar.query_worker[qid]].update(kws)
        # Each worker knows the codes of its own queries' keywords, not the whole vocabulary.
        assert [s.keywords for s in rt.registrar.stats()] == [len(w) for w in words]
        assert max(len(w) for w in words) < len(rt.plan.routing.table.vocabulary)
        seen = stream_order(read_objects(objects_dir), None).slice(0, initial + 20 * 1000)
        assert assert_exact(redis_url, namespace, queries, BruteForceKnn(seen)) == queries.num_rows


@pytest.fixture(scope="module")
def small(places_slice, slice_queries):
    objects = stream_order(read_objects(str(places_slice)), None)
    return str(places_slice), load_queries(str(slice_queries)).slice(0, 1500), objects


def test_a_bounded_routing_table_holds_pairs_as_rectangles_through_a_rebuild(small, redis_url, namespace, tmp_path):
    """A table bounded far below its pairs' cells holds the rest as rectangles (issue 37), at the
    plan and after a run-time rebuild (the rectangles recoded into the run's keyword codes): the
    results stay exact. The rebuild runs in a process of its own at the lowest CPU priority."""
    objects_dir, queries, objects = small
    config = RunConfig(workers=3, initial=4000, batch=500, routing_entries=2000, executor="inline",
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        routing = rt.dispatcher.routing
        assert len(routing.table.keys) <= 2000 and len(routing.table.regions) > 0
        for _, b in zip(range(4), rt.batches()):
            rt.process(b)
        before = {p.pid for p in psutil.Process().children()}
        rt.upkeep.rebuild()
        builders = [p for p in psutil.Process().children() if p.pid not in before and p.nice() == BUILD_NICE]
        assert len(builders) == 1 and rt.upkeep.rebuilds == 1
        assert len(routing.table.regions) > 0
        words = {routing.table.vocabulary[c] for c in routing.table.regions.code.tolist()}
        assert words <= {w for kws in queries.column("keywords").to_pylist() for w in kws}
        rt.run(progress=False)
        assert_exact(redis_url, namespace, queries, BruteForceKnn(objects))


@pytest.mark.parametrize("overlap", [True, False], ids=["writes-overlapped", "sync-writes"])
def test_one_inline_worker(small, redis_url, namespace, tmp_path, overlap):
    objects_dir, queries, objects = small
    config = RunConfig(workers=1, initial=4000, batch=500, store=StoreConfig(redis_url, namespace, str(tmp_path)),
                       executor="inline", overlap_writes=overlap)
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        summary = rt.run(progress=False)
        assert_exact(redis_url, namespace, queries, BruteForceKnn(objects))
    # Either way each batch's row carries its script's server time (from KnnWorker.written when queued).
    assert summary.results_changed > 0 and summary.redis_server_ms_mean > 0


def test_register_mid_stream_unregister_and_duplicates(small, executor, redis_url, namespace, tmp_path):
    objects_dir, queries, objects = small
    config = RunConfig(workers=3, initial=4000, batch=500, store=StoreConfig(redis_url, namespace, str(tmp_path)),
                       executor=executor)
    client, keys = connect(redis_url), Keys(namespace)
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        batches = list(rt.batches())
        for b in batches[:6]:
            rt.process(b)
        seen = 4000 + 6 * 500
        # A query registered mid-stream starts from its exact kNN over the objects seen so far.
        probe = objects.slice(100, 1).to_pylist()[0]
        words = probe["keywords"][:2]
        reg = rt.registrar
        [w] = reg.register([Query.create("late", probe["lon"] + 0.01, probe["lat"], words, 7)])
        assert 0 <= w < 3
        want = BruteForceKnn(objects.slice(0, seen)).knn(probe["lon"] + 0.01, probe["lat"], words, 7)
        assert client.zrange(keys.result("late"), 0, -1) == [x[0] for x in want]
        with pytest.raises(InvalidQueryError, match="already registered"):
            reg.register([Query.create("late", 1.0, 1.0, ["food"], 1)])
        with pytest.raises(InvalidQueryError, match="no_keywords"):
            Query.create("bad", 1.0, 1.0, ["the"], 3)  # a stop word only: no keyword left
        # A query whose k exceeds its matches holds all of them.
        [rare] = reg.register([Query.create("rare", -72.0, 43.0, ["zzzneverseen"], 5)])
        assert rare >= 0 and client.zcard(keys.result("rare")) == 0
        # Unregister deletes its keys.
        gone = queries.column("id")[0].as_py()
        assert reg.unregister(gone) and not reg.unregister(gone)
        assert not client.exists(keys.result(gone), keys.query(gone))
        # A batch repeating ids: within itself and from before; the repeats are ignored and counted.
        nxt = batches[6]
        dup = pa.concat_tables([nxt, nxt.slice(0, 10), batches[0].slice(0, 5)])
        r = rt.process(dup)
        assert r.duplicates == 15 and r.objects == nxt.num_rows
        for b in batches[7:]:
            rt.process(b)
        rest = queries.filter(pa.compute.not_equal(queries.column("id"), gone))
        oracle = BruteForceKnn(objects)
        assert_exact(redis_url, namespace, rest, oracle)
        want = oracle.knn(probe["lon"] + 0.01, probe["lat"], words, 7)
        assert client.zrange(keys.result("late"), 0, -1) == [x[0] for x in want]
        assert client.hget(keys.query("late"), "worker") == str(w)
        entries = client.xrange(keys.changes, count=5)
        assert entries and {"version", "changes"} == set(entries[0][1])
    client.close()


@pytest.mark.parametrize("executor", [pytest.param("ray", marks=pytest.mark.slow), "inline"],  # (ray: 7 s)
                         indirect=True)
def test_antimeridian_and_high_latitudes(spark, executor, redis_url, namespace, tmp_path):
    rng = np.random.default_rng(5)
    lines = []
    for i in range(600):
        lon = float(rng.choice([179.99, -179.99, 10.0])) + rng.normal(0, 0.02)
        lon = (lon + 180) % 360 - 180
        lat = float(rng.choice([0.0, 89.95, -89.95, 70.0])) + rng.normal(0, 0.01)
        lat = max(-90.0, min(90.0, lat))
        tag = str(rng.choice(["ice", "sea", "camp"]))
        lines.append(json.dumps({"type": "Feature", "id": f"SG_p{i}@{1000 + i}",
                                 "geometry": {"type": "Point", "coordinates": [lon, lat]},
                                 "properties": {"classifiers": [], "tags": [tag]}}))
    (tmp_path / "polar.geojson").write_text("\n".join(lines) + "\n")
    ingest_places([str(tmp_path / "polar.geojson")], str(tmp_path / "objects"), grid_n=16)
    q = pa.table({"id": [f"q{i}" for i in range(8)],
                  "lon": [180.0, -180.0, 179.995, 0.0, 90.0, -90.0, 10.0, -179.999],
                  "lat": [0.0, 0.0, 0.01, 90.0, 89.99, -90.0, 70.0, 0.0],
                  "keywords": [["ice"], ["sea"], ["camp", "ice"], ["ice"], ["sea"], ["camp"], ["ice", "sea"], ["camp"]],
                  "k": pa.array([5, 3, 8, 4, 6, 2, 10, 1], type=pa.int32())})
    config = RunConfig(workers=2, initial=200, batch=50, store=StoreConfig(redis_url, namespace, str(tmp_path)),
                       executor=executor)
    with Runtime(str(tmp_path / "objects"), q, config, reviver=Reviver) as rt:
        rt.run(progress=False)
        objects = stream_order(read_objects(str(tmp_path / "objects")), None)
        assert_exact(redis_url, namespace, q, BruteForceKnn(objects))


def test_a_killed_ray_worker_surfaces_as_worker_lost(small, ray_instance, redis_url, namespace, tmp_path):
    import time

    objects_dir, queries, _ = small
    config = RunConfig(workers=2, initial=4000, batch=500, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries.slice(0, 200), config, reviver=Reviver) as rt:
        rt.process(next(rt.batches()))
        rt.pool.kill(1)  # asynchronous: calls may still reach the actor for a moment
        with pytest.raises(WorkerLostError, match="worker 1 was lost") as ex:
            for _ in range(100):
                rt.pool.gather([rt.pool.stats(0), rt.pool.stats(1)])
                time.sleep(0.05)
        assert ex.value.worker == 1


def test_a_routing_rebuild_in_flight_is_waited_for_at_close(small, ray_instance, redis_url, namespace, tmp_path):
    """``knnmon run --rebalance`` with Ray workers exited with status 1 and no summary (issue
    36): a re-plan's routing rebuild was still waiting on the workers (their regions, queued
    behind the batches in flight) in its own thread when the run shut Ray down, and a Ray call
    after the shutdown ends the process. Closing the upkeep waits for the build to return."""
    objects_dir, queries, _ = small
    config = RunConfig(workers=2, initial=4000, batch=500, in_flight=4,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        for _, b in zip(range(3), rt.batches()):  # in flight, not collected
            rt.dispatcher.dispatch(b)
        rt.upkeep.request()
        rt.upkeep_routing()
        build = rt.upkeep._build
        assert build is not None
        rt.upkeep.close()
        assert build.done() and build.exception() is None and not rt.upkeep.building


@contextlib.contextmanager
def _two_ray_workers_after_three_batches(small, redis_url, namespace, tmp_path):
    """A runtime of 2 Ray workers over the slice, its first 3 batches processed: ``(rt, batches)``."""
    objects_dir, queries, _ = small
    config = RunConfig(workers=2, initial=4000, batch=500, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(objects_dir, queries, config, reviver=Reviver) as rt:
        batches = list(rt.batches())
        for b in batches[:3]:
            rt.process(b)
        yield rt, batches


@pytest.mark.parametrize("written", [False, pytest.param(True, marks=pytest.mark.slow)],  # (after writing: 7 s)
                         ids=["killed-before-writing", "killed-after-writing"])
def test_a_killed_ray_worker_process_is_revived_mid_stream_and_stays_exact(small, ray_instance, redis_url, namespace,
                                                                           tmp_path, written):
    import os
    import signal

    _, queries, objects = small
    client, keys = connect(redis_url), Keys(namespace)
    with _two_ray_workers_after_three_batches(small, redis_url, namespace, tmp_path) as (rt, batches):
        victim = rt.registrar.stats()[1].pid
        pending = [rt.dispatcher.dispatch(b) for b in batches[3:5]]  # two batches in flight
        if written:  # the worker applies and writes both before it dies: none may be applied again
            rt.pool.gather([rt.pool.last_write(1)])  # (answered after the calls before it, and their writes)
        os.kill(victim, signal.SIGKILL)
        later = deque(pending[1:])
        rt.reviver.collect(pending[0], later)
        rt.reviver.collect(later.popleft(), later)
        for b in batches[5:]:
            rt.process(b)
        assert rt.workers_revived == 1 and victim not in [s.pid for s in rt.registrar.stats()]
        oracle = BruteForceKnn(objects)
        assert_exact(redis_url, namespace, queries, oracle)
        # The revived worker equals one that never died: the same queries, each with its exact kNN
        # in memory and the kNN radius of its k-th place.
        held, radii = rt.pool.gather([rt.pool.regions(1)])[0]
        held = held.to_pylist()
        assert sorted(q["id"] for q in held) == sorted(q for q, w in rt.registrar.query_worker.items() if w == 1)
        for i in range(0, len(held), 5):
            q = held[i]
            want = oracle.knn(q["lon"], q["lat"], q["keywords"], q["k"])
            got = rt.pool.gather([rt.pool.result(1, q["id"])])[0]
            assert got == want
            assert radii[i] == (want[-1][1] if len(want) >= q["k"] else np.inf)
    assert_applied_once(client, keys)  # no batch applied twice


def _kill_process(pid: int) -> None:
    """SIGKILL a worker's process and wait until it is gone."""
    import os
    import signal
    import time

    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.mark.slow  # 9 s; the model-based test loses workers between batches and registers after
def test_a_ray_worker_lost_outside_a_batch_is_revived_for_a_registration_and_an_unregister(
        small, ray_instance, redis_url, namespace, tmp_path):
    """A worker that dies between batches is revived in place by the registration or unregister
    that finds it gone (not by rebuilding every worker), and the operation completes on it."""
    _, queries, objects = small
    client, keys = connect(redis_url), Keys(namespace)
    with _two_ray_workers_after_three_batches(small, redis_url, namespace, tmp_path) as (rt, batches):
        reg = rt.registrar
        pids = {s.worker: s.pid for s in reg.stats()}
        probe = objects.slice(100, 1).to_pylist()[0]
        late = Query.create("late", probe["lon"] + 0.01, probe["lat"], probe["keywords"][:2], 7)
        w = reg.place(late.lon, late.lat)  # where it will go (placement changes nothing)
        _kill_process(pids[w])
        assert reg.register([late]) == [w]
        assert rt.workers_revived == 1
        gone = next(q for q, x in reg.query_worker.items() if x == 1 - w)
        _kill_process(pids[1 - w])
        assert reg.unregister(gone)
        assert rt.workers_revived == 2 and not client.exists(keys.result(gone), keys.query(gone))
        assert not set(pids.values()) & {s.pid for s in reg.stats()}  # both processes are new
        for b in batches[3:]:
            rt.process(b)
        oracle = BruteForceKnn(objects)
        rest = queries.filter(pa.compute.not_equal(queries.column("id"), gone))
        assert_exact(redis_url, namespace, rest, oracle)
        want = oracle.knn(late.lon, late.lat, late.keywords, late.k)
        assert [(o, pytest.approx(d)) for o, d in want] == [tuple(x) for x in client.zrange(keys.result("late"), 0, -1,
                                                                                            withscores=True)]
    assert_applied_once(client, keys)
    client.close()


@pytest.mark.slow  # 9 s; test_worker_pool.py and the model-based test find lost workers in the default suite
def test_a_worker_found_lost_by_the_last_writes_or_the_worker_list_is_revived(small, ray_instance, redis_url,
                                                                              namespace, tmp_path):
    """The service's other calls between batches (the check of the last writes after an outage,
    the worker list for its status) revive a lost worker in place too, and answer."""
    _, queries, objects = small
    with _two_ray_workers_after_three_batches(small, redis_url, namespace, tmp_path) as (rt, batches):
        pids = [p.pid for p in rt.worker_processes()]
        _kill_process(pids[0])
        writes = rt.last_writes()
        assert rt.workers_revived == 1 and len(writes) == 2 and not any(failed for _, failed in writes)
        _kill_process(pids[1])
        now = rt.worker_processes()
        assert rt.workers_revived == 2 and not set(pids) & {p.pid for p in now}
        for b in batches[3:]:
            rt.process(b)
        assert_exact(redis_url, namespace, queries, BruteForceKnn(objects))


@pytest.mark.slow  # 8 s
def test_a_revival_whose_spare_is_dead_starts_over_on_a_new_actor(small, ray_instance, redis_url, namespace,
                                                                  tmp_path):
    """The spare died with the node that took the worker: the revival's calls to it fail, and the
    worker is revived again on a new actor (not a rebuild of every worker), exact after."""
    import uuid

    from knnmon.coordinator.runtime.ray_pool import RayPool
    from knnmon.workers.settings import WorkerSettings

    objects_dir, queries, objects = small
    config = RunConfig(workers=2, initial=4000, batch=500, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    pool = RayPool(2, WorkerSettings(redis_url, namespace, reserve=config.places_reserved),
                   detach_as=f"knnmon-test-{uuid.uuid4().hex[:8]}", spare=True, orphan_s=None)
    with Runtime(objects_dir, queries, config, pool=pool, reviver=Reviver) as rt:
        batches = list(rt.batches())
        for b in batches[:3]:
            rt.process(b)
        dead_spare = pool.spare
        pool._ray.kill(dead_spare)
        victim = rt.registrar.stats()[1].pid
        _kill_process(victim)
        for b in batches[3:]:
            rt.process(b)
        assert rt.workers_revived == 2  # the dead spare's attempt, then a new actor
        assert pool.actors[1] is not dead_spare and victim not in [s.pid for s in rt.registrar.stats()]
        assert_exact(redis_url, namespace, queries, BruteForceKnn(objects))
