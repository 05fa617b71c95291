"""``knnmon run`` and ``knnmon serve`` on the real 3-node Ray cluster of ``deploy/local-cluster.sh``:
workers on more than one node, results exact against the brute-force oracle, through the restart
of a worker node under a windowed service."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from tests.support import assert_exact, knnmon_cli, publish_objects, register_fields, wait_processed

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local-cluster.sh"


def knnmon(*args: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return knnmon_cli(*args, env=env, timeout=timeout)


def test_run_on_the_local_cluster_spreads_workers_and_stays_exact(local_cluster, places_slice, slice_queries, redis_url,
                                                                  namespace, tmp_path):
    address, env, _ = local_cluster
    report = tmp_path / "run.json"
    out = knnmon("run", "--objects", str(places_slice), "--queries", str(slice_queries), "--workers", "3",
                 "--initial", "5000", "--set", f"workers.ray_address={address}", "--redis", redis_url, "--namespace",
                                                                      namespace,
                 "--report", str(report), "--quiet", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(report.read_text())["workers_stats"]
    nodes = {w["node"] for w in stats}
    assert len(nodes) == 3 and None not in nodes, stats  # worker w on node w mod 3
    objects = read_objects(str(places_slice))
    assert assert_exact(redis_url, namespace, pq.read_table(slice_queries), BruteForceKnn(objects)) == 4000


@pytest.mark.slow  # 19 s; the default suite runs knnmon run on the local cluster above
def test_serve_on_the_local_cluster_spreads_workers_and_stays_exact(local_cluster, places_slice, slice_queries,
                                                                    redis_url,
                                                                    namespace, tmp_path):
    address, env, _ = local_cluster
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None).to_pylist()
    queries = pq.read_table(slice_queries).slice(0, 300)
    for q in queries.to_pylist():
        r.xadd(keys.ingest_queries, register_fields(q))
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--workers", "3",
                             "--ray-address", address, "--redis", redis_url, "--namespace", namespace,
                             "--data-dir", str(tmp_path / "data")], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        publish_objects(r, keys, places)
        wait_processed(r, keys, proc, timeout_s=300)
        for _ in range(20):  # the service publishes its status once a second, and when it goes idle
            status = knnmon("status", "--json", "--redis", redis_url, "--namespace", namespace, env=env, timeout=60)
            assert status.returncode == 0, status.stderr
            service = json.loads(status.stdout)["service"]
            if service["objects"] == len(places):
                break
            time.sleep(0.5)
        assert len(set(service["worker_nodes"])) == 3 and sum(service["queries_per_worker"]) == 300, (
            service, (tmp_path / "serve.log").read_text()[-3000:])
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert assert_exact(redis_url, namespace, queries, BruteForceKnn(pa.Table.from_pylist(places))) == 300


@pytest.mark.slow  # 34 s; the chaos soak restarts a node under load too (tests/system/chaos_soak.py)
def test_a_windowed_serve_rides_out_the_restart_of_a_worker_node(local_cluster, places_slice, slice_queries, redis_url,
                                                                 namespace, tmp_path):
    """``local-cluster.sh restart worker1`` mid-stream: the workers it hosted die with it and are
    revived in place on the nodes alive (no rebuild of the others), the node joins again, and
    every result is exact over the live objects."""
    from knnmon.coordinator.runtime.preparation import with_arrival_times

    address, env, script_env = local_cluster
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = with_arrival_times(stream_order(read_objects(str(places_slice)), None), 1000).to_pylist()
    queries = pq.read_table(slice_queries).slice(0, 300)
    for q in queries.to_pylist():
        r.xadd(keys.ingest_queries, register_fields(q))
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--workers", "3",
                             "--window", "1500s", "--ray-address", address, "--redis", redis_url, "--namespace",
                             namespace, "--data-dir", str(tmp_path / "data")], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        publish_objects(r, keys, places[:3000])
        wait_processed(r, keys, proc, timeout_s=300)
        restarted = subprocess.run([str(SCRIPT), "restart", "worker1"], env=script_env, capture_output=True, text=True,
                                   timeout=300)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        publish_objects(r, keys, places[3000:])
        wait_processed(r, keys, proc, timeout_s=300)
        time.sleep(1.5)
        service = json.loads(knnmon("status", "--json", "--redis", redis_url, "--namespace", namespace, env=env,
                                    timeout=60).stdout)["service"]
        assert service["workers_revived"] >= 1 and service["worker_restarts"] == 0, \
            (service, (tmp_path / "serve.log").read_text()[-3000:])
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    live = places[-1500:]
    assert assert_exact(redis_url, namespace, queries, BruteForceKnn(pa.Table.from_pylist(live))) == 300
