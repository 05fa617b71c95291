"""The pools send a worker only calls of its typed interface, and a worker answers all of them."""

from __future__ import annotations

import inspect

from knnmon.coordinator.runtime.worker_pool import InlinePool, WorkerPool
from knnmon.query import QueryColumns
from knnmon.workers.interface import WorkerApi
from knnmon.workers.worker import KnnWorker


def _api() -> set[str]:
    return {n for n, f in inspect.getmembers(WorkerApi, inspect.isfunction) if not n.startswith("_")}


def test_a_worker_answers_every_call_of_the_interface_with_the_same_parameters():
    w = KnnWorker(0)
    assert isinstance(w, WorkerApi)
    for name in _api():
        mine, api = inspect.signature(getattr(w, name)), inspect.signature(getattr(WorkerApi, name))
        wanted = [p for p in api.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD]
        for p in wanted:  # every parameter the interface names, the worker takes by that name
            assert p.name in mine.parameters, (name, p.name)


def test_the_pool_sends_each_call_by_its_interface_method():
    sent: list[str] = []

    class Recorder(InlinePool):
        def call(self, worker, method, *args, **kwargs):
            sent.append(method.__name__)
            return super().call(worker, method, *args, **kwargs)

    pool = Recorder([KnnWorker(0)])
    pool.gather([pool.load(0, QueryColumns(["q"], [0.0], [0.0], [["cafe"]], [1]), [[]], {})])
    pool.gather([pool.regions(0), pool.stats(0), pool.query_loads(0), pool.result(0, "q"), pool.expire(0, 0),
                 pool.written(0, 0), pool.last_write(0), pool.regions_with(0, ["cafe"]), pool.unregister(0, "q"),
                 pool.release_handed(0)])
    assert set(sent) <= _api() and {"load_queries", "regions", "unregister_query"} <= set(sent)
    typed = {n for n, f in inspect.getmembers(WorkerPool, inspect.isfunction)
             if not n.startswith("_")
             and n not in ("call", "gather", "gather_each", "ready", "share", "close", "reset_taken", "replace")}
    assert len(typed) == len(_api())  # one typed sender per call of the interface


def test_a_process_keeps_its_sigterm_handler_through_ray_start_and_shutdown():
    """``ray.init`` installs a handler that exits 15, and Ray's shut-down core worker leaves
    SIGTERM at its default action (status -15): the service's own handler must answer a SIGTERM
    after both (a rebuild disconnects from Ray and joins it again)."""
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "from knnmon.coordinator.runtime.ray_start import init_ray, shutdown_ray\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
            "assert init_ray()\n"
            "shutdown_ray()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "signal.pause()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 7, done.stderr[-2000:]
