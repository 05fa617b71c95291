"""A service's detached worker actors (``workers/actor.py``, ``RayPool(detach_as=...)``): a
restarted service takes the processes the one before left as they are (and resets them to empty
workers when it does not keep them); extra ones are killed; an
actor whose service's heartbeat stops exits on its own."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import redis

from knnmon.coordinator.runtime.ray_pool import RayPool
from knnmon.coordinator.service.status import Heartbeat
from knnmon.keys import Keys
from knnmon.query import QueryColumns
from knnmon.workers.actor import RAY_NAMESPACE
from knnmon.workers.settings import WorkerSettings


#: How long an actor may take to answer: one starting on a loaded machine imports knnmon and
#: loads its compiled kernels first (over 60 s seen with the suite and a CPU-bound job beside it).
ANSWER_S = 300


def _named(prefix: str) -> list[str]:
    from ray.util import list_named_actors

    return sorted(e["name"] for e in list_named_actors(all_namespaces=True)
                  if e["namespace"] == RAY_NAMESPACE and e["name"].startswith(prefix + ":"))


def _wait_for(predicate, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


def _stats(pool: RayPool) -> list[dict]:
    return pool.gather([pool.stats(w) for w in range(pool.size)])


def test_a_restarted_service_takes_the_workers_processes_and_can_empty_them(ray_instance, redis_url, namespace):
    prefix = f"knnmon-test-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings(redis_url, namespace)
    first = RayPool(2, settings, detach_as=prefix, orphan_s=None)
    assert first.taken == 0 and len(_named(prefix)) == 2
    q = QueryColumns(np.array(["q1"], dtype=object), np.array([-71.0]), np.array([43.0]), [("cafe",)],
                     np.array([3], dtype=np.int64))
    first.gather([first.load(0, q, [[]], {}, write=False, vocabulary={"cafe": 0})])
    before = _stats(first)
    assert before[0].queries == 1
    # The service "dies": its pool is dropped without close (a SIGKILL kills nothing detached).
    second = RayPool(2, settings, detach_as=prefix, orphan_s=None)
    assert second.taken == 2 and [second.kept[w].queries for w in (0, 1)] == [1, 0]  # as they were
    second.reset_taken()  # (the service does not keep them: kept_start)
    after = _stats(second)
    assert [s.pid for s in after] == [s.pid for s in before]  # the same processes
    assert [s.queries for s in after] == [0, 0]  # empty
    # A service with fewer workers takes what it needs and kills the rest.
    third = RayPool(1, settings, detach_as=prefix, orphan_s=None)
    assert third.taken == 1 and _stats(third)[0].pid == before[0].pid
    assert _wait_for(lambda: len(_named(prefix)) == 1)
    third.close()
    assert _wait_for(lambda: not _named(prefix))


@pytest.mark.parametrize("beating", [True, False], ids=["heartbeat", "no-heartbeat"])
def test_a_detached_worker_exits_when_its_services_heartbeat_stops(ray_instance, redis_url, namespace, beating):
    from ray.exceptions import RayActorError

    prefix = f"knnmon-test-{uuid.uuid4().hex[:8]}"
    heart = Heartbeat(redis_url, Keys(namespace), every_s=0.1)
    try:
        pool = RayPool(1, WorkerSettings(redis_url, namespace), detach_as=prefix, orphan_s=0.5)
        pid = _stats(pool)[0].pid
        time.sleep(1.5)  # three times the orphan age, beating: alive
        assert _stats(pool)[0].pid == pid
        if beating:
            return
        heart.stop()
        assert not redis.Redis.from_url(redis_url).exists(Keys(namespace).serve_alive)
        def exited() -> bool:  # (two reads 0.05 s apart once the key is gone)
            try:
                pool._ray.get(pool.actors[0].stats.remote(), timeout=20)
                return False
            except RayActorError:
                return True

        assert _wait_for(exited)
        assert _wait_for(lambda: not _named(prefix))
    finally:
        heart.stop()
        if beating:
            pool.close()


def test_a_lost_worker_becomes_the_started_spare(ray_instance, redis_url, namespace):
    """With a spare, a replaced worker is the spare's process, reset to the worker (no process to
    start), and a new spare starts; without one, a new process."""
    prefix = f"knnmon-test-{uuid.uuid4().hex[:8]}"
    pool = RayPool(2, WorkerSettings(redis_url, namespace), detach_as=prefix, spare=True, orphan_s=None)
    try:
        spare_pid = pool._ray.get(pool.spare.stats.remote(), timeout=ANSWER_S).pid
        before = _stats(pool)
        assert spare_pid not in {s.pid for s in before}
        pool.kill(1)
        pool.replace(1)
        after = _stats(pool)
        assert after[1].pid == spare_pid and after[1].worker == 1 and after[0].pid == before[0].pid
        new_spare = pool._ray.get(pool.spare.stats.remote(), timeout=ANSWER_S).pid
        assert new_spare not in {s.pid for s in after}
        assert len(_named(prefix)) == 3  # two workers and the new spare
        # A restart takes each worker as the worker it was (the revived one keeps its spare's
        # name), and the spare as its spare: no process to start.
        again = RayPool(2, WorkerSettings(redis_url, namespace), detach_as=prefix, orphan_s=None,
                        spare=True)
        assert again.taken == 2 and [again.kept[w].worker for w in (0, 1)] == [0, 1]
        assert [s.pid for s in _stats(again)] == [after[0].pid, after[1].pid]
        assert again._ray.get(again.spare.stats.remote(), timeout=ANSWER_S).pid == new_spare
    finally:
        pool.close()
    assert _wait_for(lambda: not _named(prefix))
