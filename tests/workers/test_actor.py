"""The worker as a Ray actor: what its calls leave behind in Ray's GCS."""

from __future__ import annotations

import time

from knnmon.workers.actor import WorkerActor
from knnmon.workers.settings import WorkerSettings


def _task_names(actor) -> list[str]:
    """The names of the tasks of ``actor`` whose events Ray's GCS holds."""
    from ray._private.state import state  # (what ray.timeline reads)

    me = actor._actor_id.binary()
    return [e.task_info.name for e in state._get_all_task_events()
            if e.HasField("task_info") and e.task_info.actor_id == me]


def test_a_workers_calls_leave_no_task_events_in_the_gcs(ray_instance):
    """The GCS keeps the events of up to 100,000 tasks: a service's thousands of calls a minute
    grew the head node's memory for hours. A worker's calls record none; an actor that asks for
    them shows the GCS does record (so the first check could fail)."""
    ray = ray_instance
    quiet = WorkerActor().remote(0, WorkerSettings())
    loud = WorkerActor(enable_task_events=True).remote(1, WorkerSettings())
    for _ in range(5):
        ray.get([quiet.stats.remote(), loud.stats.remote()], timeout=120)  # (a stall fails, not hangs)
    deadline = time.monotonic() + 30
    while "WorkerHost.stats" not in _task_names(loud) and time.monotonic() < deadline:
        time.sleep(0.5)  # (events reach the GCS about once a second)
    assert "WorkerHost.stats" in _task_names(loud)
    assert _task_names(quiet) == []
    for a in (quiet, loud):
        ray.kill(a)
