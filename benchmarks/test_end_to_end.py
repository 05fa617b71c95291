"""End to end: ``knnmon run`` and ``knnmon serve``'s objects per second, beside the
single-process reference (keyword lists, one process, no assignment) measured in the same run."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from benchmarks.conftest import SCALE
from knnmon.coordinator.bench.runner import REFERENCE, BenchConfig, run_bench


def test_run_against_the_reference(benchmark, objects_dir, ray_session):
    """``run`` with the proposed plan on Ray workers, and the reference, on the same stream:
    ``extra_info`` holds both throughputs and their ratio."""
    cfg = BenchConfig(objects=objects_dir, queries=(SCALE.queries,), kmax=(SCALE.kmax,), workers=(SCALE.workers,),
                      algorithms=(REFERENCE, "proposed"), initial=SCALE.initial, batches=SCALE.batches, shuffle=1)
    out = benchmark.pedantic(run_bench, args=(cfg,), kwargs={"progress": False, "log": lambda _: None},
                             rounds=1, iterations=1)
    speed = {row["algorithm"]: row["objects_per_s"] for row in out["rows"]}
    benchmark.extra_info.update(objects_per_s=speed, over_reference=speed["proposed"] / speed[REFERENCE])
    assert speed["proposed"] > 0 and speed[REFERENCE] > 0


@pytest.mark.parametrize("executor", ("inline", "ray"))
def test_serve_drains_a_stream(benchmark, objects_dir, queries_file, redis_url, ray_session, executor):
    """``serve`` (in this process): ``scale.queries`` registrations and ``initial + batches x
    1,000`` objects waiting in its streams, then drained; ``extra_info``: objects per second,
    registration and start included."""
    import pyarrow.parquet as pq

    from knnmon.client import KnnClient
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.service.config import ServeConfig
    from knnmon.coordinator.service.loop import Service
    from knnmon.ingest.reading import read_objects
    from knnmon.store import StoreConfig

    n = SCALE.initial + SCALE.batches * 1000
    objects = read_objects(objects_dir).slice(0, n).select(["id", "lon", "lat", "t", "keywords"]).to_pylist()
    queries = pq.read_table(queries_file).to_pylist()

    def setup():
        namespace = f"bench-serve-{uuid.uuid4().hex[:8]}"
        client = KnnClient(redis_url, namespace)
        for q in queries:
            client.register(q["id"], q["lon"], q["lat"], q["keywords"], k=q["k"])
        client.publish(objects)
        run = RunConfig(workers=SCALE.workers, executor=executor, store=StoreConfig(url=redis_url, namespace=namespace))
        return (ServeConfig(run=run),), {}

    def drain(config):
        t0 = time.perf_counter()
        with Service(config) as svc:
            counters = svc.run(idle_exit_s=0.5, handle_signals=False)
        benchmark.extra_info.update(objects_per_s=n / (time.perf_counter() - t0 - 0.5), counters=counters)
        return counters

    counters = benchmark.pedantic(drain, setup=setup, rounds=1, iterations=1)
    assert counters["objects"] == n, counters


@pytest.mark.parametrize("index", ("grid", "rtree"))
def test_run_in_one_process(benchmark, objects_dir, queries_file, redis_url, index):
    """``run`` with one in-process worker, the workers' two query indexes on the same stream
    (docs/architecture.md): ``extra_info`` holds objects/s and the update time per batch."""
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.store import StoreConfig

    config = RunConfig(workers=1, executor="inline", index=index, initial=SCALE.initial, batches=SCALE.batches,
                       store=StoreConfig(url=redis_url, namespace=f"bench-{index}-{uuid.uuid4().hex[:6]}"))

    def run():
        with Runtime(objects_dir, queries_file, config) as rt:
            return rt.run(progress=False)

    s = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(objects_per_s=s.objects_per_s, update_ms_mean=s.update_ms_mean,
                                update_ms_p99=s.update_ms_p99)
    assert s.batches == SCALE.batches and s.objects == SCALE.batches * 1000


def test_serve_under_load(benchmark, objects_dir, queries_file, tmp_path, monkeypatch):
    """``knnmon serve`` in its own process, its queries registered through the stream, then the
    objects published as fast as it takes them (:mod:`benchmarks.serve_load`): ``extra_info``
    holds objects/s, the latency XADD -> acknowledged (p50, p99, max) and each process's CPU
    time per object; the results are checked against the oracle on a sample."""
    from benchmarks import serve_load

    monkeypatch.setenv("KNNMON_WORKERS_EXECUTOR", SCALE.executor)  # (the service's setting)
    report = tmp_path / "serve.json"
    args = ["--objects", objects_dir, "--queries", queries_file, "--queries-n", str(min(SCALE.queries, 10_000)),
            "--initial", str(SCALE.initial), "--objects-n", str(SCALE.batches * 1000), "--workers", str(SCALE.workers),
            "--check", str(SCALE.check_sample), "--report", str(report)]
    assert benchmark.pedantic(serve_load.main, args=(args,), rounds=1, iterations=1) == 0
    row = json.loads(report.read_text())
    benchmark.extra_info.update({k: row[k] for k in ("objects_per_s", "latency_ms_p50", "latency_ms_p99",
                                                     "latency_ms_max", "cpu_us_per_object", "register_s")})
    assert row["exact"] is True
