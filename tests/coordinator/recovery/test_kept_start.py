"""A restarted service keeps its predecessor's workers as they are (coordinator/recovery/kept_start.py,
workers/kept_state.py): the service dies in the middle of a batch that one Ray worker was sent and
the others were not; the next one takes the same processes with their queries (nothing loaded
from Redis), replays what was in flight, and every result is exact against the brute-force
oracle over the live places. The service runs in this process with the session's Ray instance
as its cluster (detached worker actors), against the real Redis."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS, RunConfig
from knnmon.coordinator.runtime.ray_pool import RayPool
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from tests.support import assert_applied_once, assert_exact, publish_objects, register_fields
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.protocol import GROUP
from knnmon.store import StoreConfig

WINDOW_MS = 1_200_000  # 1,200 places at one a second


class _Crash(BaseException):
    """The service dies here (it leaves run() as SIGKILL would, closing nothing)."""


def _places(places_slice, n: int) -> list[dict]:
    places = stream_order(read_objects(str(places_slice)), None).slice(0, n)
    t = ARRIVAL_EPOCH_MS + 1000 * pa.array(range(places.num_rows), pa.int64()).to_numpy()
    return places.set_column(places.column_names.index("t"), "t", pa.array(t)).to_pylist()


def _pids(svc: Service) -> list[int]:
    pool = svc.runtime.pool
    return [s.pid for s in pool.gather([pool.stats(w) for w in range(pool.size)])]


def test_a_restarted_service_keeps_the_workers_state_and_stays_exact(ray_instance, places_slice, slice_queries,
                                                                    redis_url, namespace, monkeypatch):
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    address = ray_instance.get_runtime_context().gcs_address
    run = RunConfig(workers=3, store=StoreConfig(url=redis_url, namespace=namespace), batch=200, window=WINDOW_MS,
                    ray_address=address)
    config = ServeConfig(run=run, max_delay_ms=5, block_ms=50)
    places = _places(places_slice, 2400)
    queries = pq.read_table(slice_queries).slice(0, 300).to_pylist()
    for q in queries:
        r.xadd(keys.ingest_queries, register_fields(q))
    publish_objects(r, keys, places)
    first = Service(config).start()
    try:
        before = _pids(first)
        # The batch holding places[1700] reaches the first worker it is sent to; then the service dies.
        target, original, sent = places[1700]["id"], RayPool.call, []

        def call(self, worker, method, *args, **kwargs):
            if method.__name__ == "process_rows" and target in args[0].table.column("id").to_pylist():
                sent.append(worker)
                if len(sent) > 1:
                    raise _Crash()
            return original(self, worker, method, *args, **kwargs)

        monkeypatch.setattr(RayPool, "call", call)
        with pytest.raises(_Crash):
            first.run(idle_exit_s=0.5, handle_signals=False)
        monkeypatch.undo()
        r.delete(keys.serve_status)  # (what a SIGKILLed service's status is after a while: gone stale)
        assert r.xpending(keys.ingest_objects, GROUP)["pending"] >= 200
        with Service(config) as svc:
            assert svc.runtime.timings.get("workers_kept") == 3 and svc.runtime.timings["replayed"] >= 200
            assert _pids(svc) == before  # the same processes, their queries kept
            svc.run(idle_exit_s=0.5, handle_signals=False)
            # The kept workers announce every deadline again to the new service: no batch of it
            # finds a list short that it did not refill ahead.
            assert svc.runtime.dispatcher.short_refills == 0
        live = [p for p in places if p["t"] > places[-1]["t"] - WINDOW_MS]
        assert assert_exact(redis_url, namespace, pa.Table.from_pylist(queries),
                            BruteForceKnn(pa.Table.from_pylist(live))) == 300
        assert not r.xpending(keys.ingest_objects, GROUP)["pending"]
        assert_applied_once(r, keys)
    finally:
        first.close()
