"""knnmon on a real 3-master Redis Cluster (started from the embedded binary on loopback ports):
run inline and with Ray, serve with the Python client, results and status, all exact against
the brute-force oracle on real places."""

from __future__ import annotations

import json
import signal
import time

import pyarrow as pa
import pytest

from knnmon.client import KnnClient
from knnmon.connection import connect
from knnmon.coordinator.cli import main
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.query import Query
from knnmon.redis_cluster import MasterMap
from knnmon.store import StoreConfig
from tests.support import (assert_exact, assert_feed_and_objects, client_round_trip, free_port_base, knnmon_cli,
                            serve_process, wait_processed)


@pytest.fixture(scope="module")
def small(places_slice, slice_queries):
    objects = stream_order(read_objects(str(places_slice)), None)
    return str(places_slice), load_queries(str(slice_queries)).slice(0, 1500), objects


@pytest.fixture(params=[pytest.param("ray", marks=pytest.mark.slow), "inline"])  # (ray: 7 s)
def executor(request):
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    return request.param


def test_run_on_a_cluster_is_exact_with_registrations_and_spreads_over_every_master(small, executor, redis_cluster_url,
                                                                                    namespace, tmp_path):
    objects_dir, queries, objects = small
    config = RunConfig(workers=3, initial=4000, batch=500, executor=executor,
                       store=StoreConfig(redis_cluster_url, namespace, str(tmp_path)))
    client, keys = connect(redis_cluster_url), Keys(namespace)
    with Runtime(objects_dir, queries, config) as rt:
        batches = list(rt.batches())
        for b in batches[:4]:
            rt.process(b)
        probe = objects.slice(100, 1).to_pylist()[0]
        rt.registrar.register([Query.create("late", probe["lon"] + 0.01, probe["lat"], probe["keywords"][:2], 7)])
        gone = queries.column("id")[0].as_py()
        assert rt.registrar.unregister(gone)
        assert not client.exists(keys.result(gone)) and not client.exists(keys.query(gone))
        for b in batches[4:]:
            rt.process(b)
        rest = queries.filter(pa.compute.not_equal(queries.column("id"), gone))
        oracle = BruteForceKnn(objects)
        assert assert_exact(redis_cluster_url, namespace, rest, oracle) == 1499
        want = oracle.knn(probe["lon"] + 0.01, probe["lat"], probe["keywords"][:2], 7)
        assert client.zrange(keys.result("late"), 0, -1) == [o for o, _ in want]
        qids = [*rest.column("id").to_pylist(), "late"]
        assert_feed_and_objects(client, keys, qids)
    masters = MasterMap(client)
    holding = {masters.master_of(keys.result(q)) for q in qids if client.exists(keys.result(q))}
    assert holding == set(masters.names) and len(holding) == 3
    client.close()


def test_run_results_and_status_commands_on_a_cluster(small, redis_cluster_url, namespace, tmp_path, capsys):
    import pyarrow.parquet as pq

    objects_dir, queries, objects = small
    qfile = tmp_path / "q.parquet"
    pq.write_table(queries.slice(0, 200), qfile)
    assert main(["run", "--objects", objects_dir, "--queries", str(qfile), "--workers", "2", "--set",
                "workers.executor=inline",
                 "--initial", "5000", "--set", "run.batch=1000", "--redis", redis_cluster_url, "--namespace", namespace,
                 "--quiet"]) == 0
    assert_exact(redis_cluster_url, namespace, queries.slice(0, 200), BruteForceKnn(objects))
    capsys.readouterr()
    assert main(["results", "q0", "--json", "--redis", redis_cluster_url, "--namespace", namespace]) == 0
    r = json.loads(capsys.readouterr().out)
    want = BruteForceKnn(objects).knn(r["query"]["lon"], r["query"]["lat"], r["query"]["keywords"], r["query"]["k"])
    assert [o["id"] for o in r["knn"]] == [o for o, _ in want] and all(o["keywords"] for o in r["knn"])
    assert main(["status", "--redis", redis_cluster_url, "--namespace", namespace]) == 0
    assert "200" in capsys.readouterr().out  # the registered queries


def test_serve_and_the_client_on_a_cluster(small, redis_cluster_url, namespace, tmp_path):
    _, _, objects = small
    places = objects.slice(0, 3000).to_pylist()
    proc = serve_process(redis_cluster_url, namespace, tmp_path / "serve.log", "--data-dir", str(tmp_path / "data"))
    try:
        client = KnnClient(redis_cluster_url, namespace=namespace)
        got, want = client_round_trip(client, places, "c1", 5)
        assert got == want and len(got) == 5
        client.client.xadd(Keys(namespace).ingest_objects, {"id": "bad", "lon": "1", "lat": "95", "keywords": "x"})
        client.publish({"id": o["id"], "lon": o["lon"], "lat": o["lat"], "t": o["t"], "keywords": o["keywords"]}
                       for o in objects.slice(3000, 2000).to_pylist())
        wait_processed(client.client, Keys(namespace), proc)
        rejects = client.rejects()
        assert [f["_reason"] for _, f in rejects] == ["latitude_out_of_range"]
        q = places[3]
        want = BruteForceKnn(objects.slice(0, 5000)).knn(q["lon"], q["lat"], q["keywords"][:1], 5)
        assert [o for o, _ in client.results("c1")] == [o for o, _ in want]
        assert {c.qid for c in client.changes()} == {"c1"}  # (the only query)
        time.sleep(1.5)
        status = knnmon_cli("status", "--redis", redis_cluster_url, "--namespace", namespace)
        assert status.returncode == 0 and "service: running" in status.stdout, status.stdout + status.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]


@pytest.mark.slow  # 12 s; the other tests here run knnmon on a cluster the package forms itself
def test_the_deploy_script_forms_a_cluster_that_knnmon_runs_on(small, tmp_path):
    """``deploy/redis-cluster.sh`` as a user runs it: 3 masters formed by ``redis-cli --cluster
    create``; ``knnmon run`` on it is exact; ``stop`` leaves none of its servers running."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    clis = [Path(d) / "redis-cli" for d in os.environ.get("PATH",
            "").split(os.pathsep) if (Path(d) / "redis-cli").is_file()]
    versions = [subprocess.run([str(c), "--version"], capture_output=True, text=True).stdout for c in clis]
    if not any(v.startswith("redis-cli ") and int(v.split()[1].split(".")[0]) >= 7 for v in versions):
        pytest.skip("no redis-cli 7.0+ on PATH (the test command installs Debian's redis-server as root, which "
                    "brings one)")
    base = free_port_base((0, 1, 2, 100, 101, 102))
    if base is None:
        pytest.skip("no free ports for a local Redis Cluster")
    script = Path(__file__).resolve().parents[2] / "deploy" / "redis-cluster.sh"
    import sys

    env = {**os.environ, "KNNMON_REDIS_CLUSTER_DIR": str(tmp_path / "rc"), "KNNMON_REDIS_PORT": str(base),
           "VIRTUAL_ENV": str(Path(sys.executable).parents[1])}
    up = subprocess.run([str(script), "start"], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        url = f"redis://127.0.0.1:{base}/0"
        assert url in up.stdout
        objects_dir, queries, objects = small
        import pyarrow.parquet as pq

        pq.write_table(queries.slice(0, 150), tmp_path / "q.parquet")
        run = knnmon_cli("run", "--objects", objects_dir, "--queries", str(tmp_path / "q.parquet"), "--workers", "2",
                         "--set", "workers.executor=inline", "--initial", "5000", "--redis", url, "--quiet")
        assert run.returncode == 0, run.stderr[-2000:]
        assert assert_exact(url, "knn", queries.slice(0, 150), BruteForceKnn(objects)) == 150
        c = connect(url)
        masters = MasterMap(c)
        assert len(masters.names) == 3
        assert len({masters.master_of(Keys().result(q)) for q in queries.slice(0, 150).column("id").to_pylist()}) == 3
        c.close()
    finally:
        down = subprocess.run([str(script), "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and down.stdout.count("stopped port") == 3
    for p in (base, base + 1, base + 2):  # nothing listens any more
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0
