"""After a Redis outage: the check that tells a Redis that kept every write (go on, no rebuild)
from one that came back without some (rebuild), on a real Redis."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

import redis

from knnmon.connection import connect
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.coordinator.recovery.object_log import create_groups
from knnmon.coordinator.recovery.outage import kept_every_write, server_ids
from tests.support import register_fields, serve_process, wait_processed
from knnmon.errors import WorkerLostError
from knnmon.keys import Keys
from knnmon.protocol import GROUP
from knnmon.redis_server import EmbeddedRedis
from knnmon.results import ResultReader
from knnmon.store import StoreConfig


def _inline(url: str, namespace: str) -> ServeConfig:
    """A service with one in-process worker over ``url``."""
    return ServeConfig(run=RunConfig(workers=1, executor="inline", store=StoreConfig(url=url, namespace=namespace)))


def _register_cafe(r, keys: Keys, k: int) -> None:
    """Register query ``q`` (cafés near (10, 50), ``k`` of them)."""
    r.xadd(keys.ingest_queries, register_fields({"id": "q", "lon": 10.0, "lat": 50.0, "keywords": ["cafe"], "k": k}))


def _never():
    raise AssertionError("the workers are asked only when the server restarted")


def test_a_restarted_redis_is_checked_for_every_write(redis_url, namespace):
    r = connect(redis_url)
    keys = Keys(namespace)
    stream = keys.ingest_objects
    create_groups(r, keys)
    ids = [r.xadd(stream, {"i": str(i)}) for i in range(3)]
    r.xreadgroup(GROUP, "serve", {stream: ">"}, count=3)
    r.xack(stream, GROUP, *ids)
    r.set(keys.worker_batch(0), "s1:5")
    same, restarted = server_ids(r), frozenset(["another run_id"])
    assert same and len(same) == 1
    last = {stream: ids[-1]}
    assert kept_every_write(r, keys, same, last, _never) is None  # the same process lost nothing
    assert kept_every_write(r, keys, restarted, last, lambda: [("s1:5", False), (None, False)]) is None
    assert "failed" in kept_every_write(r, keys, restarted, last, lambda: [("s1:5", True), (None, False)])
    assert "worker 0's last write is missing" in kept_every_write(r, keys, restarted, last,
                                                                  lambda: [("s1:6", False), (None, False)])
    # an entry read and acknowledged, but pending again: its acknowledgement was lost
    fourth = r.xadd(stream, {"i": "3"})
    r.xreadgroup(GROUP, "serve", {stream: ">"}, count=1)
    assert "pending again" in kept_every_write(r, keys, restarted, {stream: fourth}, lambda: [])
    # a read whose reply was lost (pending, but newer than anything read) is no loss
    assert kept_every_write(r, keys, restarted, last, lambda: []) is None
    # the group delivered less than this service read
    assert "delivered up to" in kept_every_write(r, keys, restarted, {stream: "99999999999999-0"}, lambda: [])
    r.delete(stream)
    assert "is gone" in kept_every_write(r, keys, restarted, last, lambda: [])


def test_a_restart_the_retries_hid_is_checked_between_steps(redis_url, namespace):
    """No read failed, but the server's run_id changed (a restart the workers' and the
    acknowledgements' retries waited through): between steps the service checks it as after an
    outage -- every write kept: counted, nothing rebuilt; a worker's last write missing: rebuilt
    from Redis."""

    r = connect(redis_url)
    keys = Keys(namespace)
    config = _inline(redis_url, namespace)
    with Service(config) as svc:
        _register_cafe(r, keys, 3)
        for i in range(20):
            r.xadd(keys.ingest_objects, {"id": f"o{i}", "lon": str(10 + i / 100), "lat": "50.0", "keywords": "cafe"})
        svc.run(idle_exit_s=0.5, handle_signals=False)
        assert svc.counters["objects"] == 20 and svc.runtime.last_writes()[0][0] is not None
        svc.life.recovered_from, svc.watch.server_checked = frozenset(["a run_id before a restart"]), 0.0
        svc.watch.server()
        assert (svc.counters["redis_outages"], svc.counters["recoveries"]) == (1, 0)
        svc.watch.server()  # the same server since: nothing more
        assert svc.counters["redis_outages"] == 1
        r.delete(keys.worker_batch(0))  # the restarted Redis lost the worker's last write
        svc.life.recovered_from, svc.watch.server_checked = frozenset(["a run_id before a restart"]), 0.0
        svc.watch.server()
        assert (svc.counters["redis_outages"], svc.counters["recoveries"]) == (1, 1)
        assert [o for o, _ in ResultReader(r, keys).result("q")] == ["o0", "o1", "o2"]


@contextlib.contextmanager
def _serving(svc: Service) -> Iterator[threading.Thread]:
    """``svc.run`` in a thread of its own, stopped and joined before the service is closed (a
    close beside a running loop would fail the loop, not the test)."""
    loop = threading.Thread(target=svc.run, kwargs={"handle_signals": False}, daemon=True)
    loop.start()
    try:
        yield loop
    finally:
        svc.stop()
        loop.join(timeout=60)


def _wait_ridden_out(svc: Service, loop: threading.Thread, n: int) -> None:
    """Until ``n`` Redis outages are ridden out (each counted once its ride-out is over)."""
    deadline = time.monotonic() + 60
    while svc.counters["redis_outages"] < n:
        assert loop.is_alive() and svc.counters["recoveries"] == 0 and time.monotonic() < deadline, svc.counters
        time.sleep(0.01)


def _serves_the_next_object(r, keys: Keys) -> None:
    _register_cafe(r, keys, 1)
    r.xadd(keys.ingest_objects, {"id": "o", "lon": "10.0", "lat": "50.0", "keywords": "cafe"})
    wait_processed(r, keys, timeout_s=60)
    assert [o for o, _ in ResultReader(r, keys).result("q")] == ["o"]


def test_a_redis_restarted_again_and_again_is_ridden_out_every_time(tmp_path, namespace):
    """Redis restarted 11 times in a row, each time while the service waits in a read: each
    outage is ridden out (every write kept), and the service goes on serving. (Found by the
    model-based test's Ray variant: the service gave up after 10 outages with no batch between
    them, and exited.)"""

    server = EmbeddedRedis(str(tmp_path / "redis"), durable=True).start()
    try:
        with Service(_inline(server.url, namespace)) as svc, _serving(svc) as loop:
            for i in range(11):
                server.stop()
                server.start()
                _wait_ridden_out(svc, loop, i + 1)  # the next restart hits the next read
            _serves_the_next_object(connect(server.url), Keys(namespace))
            assert svc.counters["recoveries"] == 0 and loop.is_alive()
    finally:
        server.stop()


def test_a_redis_restarted_while_an_outage_is_ridden_out_is_ridden_out_too(tmp_path, namespace):
    """Redis restarted again in the middle of a ride-out (checked, every write kept; the entries
    delivered meanwhile not read yet): that outage is ridden out too, nothing rebuilt. (The
    ride-out gave up and the service rebuilt from Redis; the test above restarted Redis as soon
    as an outage was counted, before its ride-out was over, and under load waited for a ride-out
    that never came.)"""

    server = EmbeddedRedis(str(tmp_path / "redis"), durable=True).start()
    server_down, restarted, started = threading.Event(), [], threading.Event()
    starting = threading.Timer(0.5, lambda: restarted.append(server.start()))
    try:
        with Service(_inline(server.url, namespace)) as svc:
            checked = svc.watch.kept_every_write

            def restart_once_checked() -> bool:
                kept = checked()
                if not server_down.is_set():  # down for 0.5 s while the ride-out goes on
                    # (once the test's own start has returned: Redis answers its PING before it
                    # does, and a stop meanwhile pulled the process from under it)
                    assert started.wait(60)
                    server_down.set()
                    server.stop()
                    starting.start()
                return kept

            svc.watch.kept_every_write = restart_once_checked
            with _serving(svc) as loop:
                server.stop()
                server.start()
                started.set()
                _wait_ridden_out(svc, loop, 1)
                # Redis was stopped in the ride-out's middle, so the ride-out counted is the one
                # over its restart too (the timer's start() returns after Redis answers: joined).
                assert server_down.is_set()
                starting.join(60)
                assert restarted
                _serves_the_next_object(connect(server.url), Keys(namespace))
                assert svc.counters["recoveries"] == 0 and loop.is_alive()
    finally:
        if server_down.is_set():
            starting.join()
        server.stop()


def test_a_service_stopped_while_redis_is_down_exits_at_once(tmp_path, namespace):
    """SIGTERM while the service waits for Redis: it exits 0 at once, without rebuilding (it
    used to try, and exit with an error), and the next service goes on from what Redis holds.
    (Found by the model-based test's Ray variant.)"""

    server, log = EmbeddedRedis(str(tmp_path / "redis"), durable=True).start(), tmp_path / "serve.log"
    try:
        r, keys = connect(server.url), Keys(namespace)
        _register_cafe(r, keys, 2)
        r.xadd(keys.ingest_objects, {"id": "o1", "lon": "10.0", "lat": "50.0", "keywords": "cafe"})
        proc = serve_process(server.url, namespace, log, workers=1)
        wait_processed(r, keys, proc, timeout_s=120)
        server.stop()
        deadline = time.monotonic() + 60
        while "unreachable" not in log.read_text():  # the idle service waits for Redis
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        r = connect(server.start().url)
        r.xadd(keys.ingest_objects, {"id": "o2", "lon": "10.001", "lat": "50.0", "keywords": "cafe"})
        config = _inline(server.url, namespace)
        with Service(config) as svc:
            svc.run(idle_exit_s=0.1, handle_signals=False)
        assert [o for o, _ in ResultReader(r, keys).result("q")] == ["o1", "o2"]
    finally:
        server.stop()


def test_a_rebuild_that_fails_is_tried_again(tmp_path, namespace):
    """A worker lost asks for a rebuild from Redis; Redis goes away in the middle of that
    rebuild, 11 times in a row: the service tries it again each time and serves on exact.
    (Found by the model-based test's Ray variant: the second failure escaped the loop and the
    service died; then, Redis restarted again and again during a rebuild, the service gave up
    after 11 failures.)"""

    server = EmbeddedRedis(str(tmp_path / "redis"), durable=True).start()
    try:
        r, keys = connect(server.url), Keys(namespace)
        config = _inline(server.url, namespace)
        _register_cafe(r, keys, 2)
        with Service(config) as svc:
            faults = [WorkerLostError(0, "lost (test)"), *[redis.ConnectionError("Redis gone mid-rebuild (test)")] * 11]
            step, start_runtime = svc._step, svc.life.start_runtime

            def failing(original, kind):
                def call(*args, **kwargs):
                    if faults and isinstance(faults[0], kind):
                        raise faults.pop(0)
                    return original(*args, **kwargs)
                return call

            svc._step = failing(step, WorkerLostError)
            svc.life.start_runtime = failing(start_runtime, redis.ConnectionError)
            r.xadd(keys.ingest_objects, {"id": "o1", "lon": "10.0", "lat": "50.0", "keywords": "cafe"})
            svc.run(idle_exit_s=0.2, handle_signals=False)
            assert not faults and svc.counters["recoveries"] == 12
            r.xadd(keys.ingest_objects, {"id": "o2", "lon": "10.001", "lat": "50.0", "keywords": "cafe"})
            svc.run(idle_exit_s=0.2, handle_signals=False)
            wait_processed(r, keys, timeout_s=10)
        assert [o for o, _ in ResultReader(r, keys).result("q")] == ["o1", "o2"]
    finally:
        server.stop()
