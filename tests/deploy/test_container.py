"""knnmon in containers (``-m container``; ``.ci/run`` runs them after the default suite): the image
built from a Debian base made on this host, ``knnmon demo`` in it equal to the host's, and the
cluster of containers of ``deploy/containers.sh`` (Redis, a Ray head running ``knnmon serve``, two
Ray worker nodes) serving a client on the host exactly, through a worker container's restart.
Everything a test starts is removed by id."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from tests.support import (assert_exact, client_round_trip, free_port_base, knnmon_cli, publish_objects,
                           register_fields, wait_processed)
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "deploy" / "containers.conf"))}


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def image() -> str:
    """``deploy/build-image.sh --base``: the image, tagged ``knnmon:<version>``, from a Debian base."""
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"Debian's {tool} is not installed (.ci/run installs it)")
    t0 = time.monotonic()
    out = subprocess.run([str(ROOT / "deploy" / "build-image.sh"), "--base"], capture_output=True, text=True,
                         timeout=1800, env=ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    image_id = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(sha256:)?[0-9a-f]{64}", image_id), out.stdout
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    inspect = json.loads(_podman("image", "inspect", f"knnmon:{version}").stdout)[0]
    assert inspect["Id"] in image_id and inspect["Config"]["User"] == "knnmon"
    assert inspect["Config"]["Entrypoint"] == ["knnmon"]
    print(f"image knnmon:{version}: built in {time.monotonic() - t0:.0f} s, {inspect['Size'] / 1e9:.2f} GB")
    return f"knnmon:{version}"


def _shown(stdout: str) -> str:
    """The demo's step 4: its queries and their kNN as stored in Redis."""
    return stdout[stdout.index("4/4"): stdout.index("Read any result later")]


def test_the_demo_in_a_container_prints_what_the_host_prints(image, tmp_path):
    cidfile = tmp_path / "demo.cid"
    try:
        inside = subprocess.run(["podman", "run", "--rm", "--network=host", "--shm-size=1g", "--cidfile", str(cidfile),
                                 image, "demo", "--queries", "300"], capture_output=True, text=True, timeout=900,
                                env=ENV)
    finally:
        if cidfile.exists():
            _podman("rm", "--force", cidfile.read_text().strip())
    assert inside.returncode == 0, inside.stderr[-3000:]
    host = knnmon_cli("demo", "--queries", "300", "--workdir", str(tmp_path / "host"), timeout=900)
    assert host.returncode == 0, host.stderr[-3000:]
    assert _shown(inside.stdout) == _shown(host.stdout)
    assert _shown(inside.stdout).count("[equals the brute-force kNN]") == 3


def _nodes(head: str, ray_port: int) -> dict[int, str]:
    """The alive Ray nodes by their node manager's port (the head's is ``ray_port + 10``, worker
    ``i``'s ``ray_port + 10 * (i + 1)``), asked from the head container."""
    code = (f"import json, ray; ray.init(address='127.0.0.1:{ray_port}', log_to_driver=False); "
            "print(json.dumps({n['NodeManagerPort']: n['NodeID'] for n in ray.nodes() if n['Alive']}))")
    out = _podman("exec", head, "python", "-c", code)
    assert out.returncode == 0, out.stderr[-2000:]
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def _status(url: str) -> dict:
    out = knnmon_cli("status", "--json", "--redis", url)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["service"]


def _shown_status(status: dict, head: str) -> tuple:
    """What an assertion on the service's status shows: its worker counts and nodes, and the head's log."""
    return ({k: status[k] for k in ("workers_revived", "worker_restarts", "recoveries", "worker_nodes")},
            _podman("logs", "--tail", "40", head).stdout)


def _workers_on_live_nodes(url: str, head: str, ray_port: int, revived_more_than: int = -1,
                           timeout_s: float = 120) -> tuple[dict, dict[int, str], float]:
    """The service's status once every worker is on a live worker node (not the head) and more than
    ``revived_more_than`` workers were revived, the alive nodes, and the seconds that took. A worker
    that no batch needed since its node died waits for the idle service's liveness check."""
    t0 = time.monotonic()
    while True:
        time.sleep(1.5)  # (the status is refreshed every second)
        status, alive = _status(url), _nodes(head, ray_port)
        on_live = set(status["worker_nodes"]) <= set(alive.values()) - {alive.get(ray_port + 10)}
        if on_live and status["workers_revived"] > revived_more_than:
            return status, alive, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout_s, (_shown_status(status, head), alive)


def test_a_cluster_of_containers_serves_a_host_client_exactly_through_a_worker_restart(image, places_slice,
                                                                                       slice_queries, tmp_path):
    base = free_port_base([0, 1, 5, *range(11, 37), *range(101, 400)], low=20_000, high=30_000)
    assert base is not None
    redis_port, ray_port, metrics_port = base, base + 1, base + 5
    env = {**ENV, "KNNMON_CONTAINERS_DIR": str(tmp_path / "cluster"), "KNNMON_IMAGE": image,
           "KNNMON_REDIS_PORT": str(redis_port), "KNNMON_RAY_PORT": str(ray_port),
           "KNNMON_METRICS_PORT": str(metrics_port), "KNNMON_SERVE_WORKERS": "4"}
    script = [str(ROOT / "deploy" / "containers.sh")]
    url = f"redis://127.0.0.1:{redis_port}/0"
    ids: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        up = subprocess.run([*script, "start"], capture_output=True, text=True, timeout=900, env=env)
        ids = {p.stem: p.read_text().strip() for p in (tmp_path / "cluster").glob("*.id")}
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        assert set(ids) == {"redis", "head", "worker1", "worker2"}
        started_s = time.monotonic() - t0

        r = redis.Redis.from_url(url, decode_responses=True)
        keys = Keys("knn")
        places = stream_order(read_objects(str(places_slice)), None).to_pylist()
        queries = pq.read_table(slice_queries).slice(0, 300).to_pylist()
        for q in queries:
            r.xadd(keys.ingest_queries, register_fields(q))
        publish_objects(r, keys, places[:4000])
        wait_processed(r, keys, timeout_s=300)

        nodes = _nodes(ids["head"], ray_port)
        status = _status(url)
        workers_on = set(status["worker_nodes"])
        assert workers_on == {nodes[ray_port + 20], nodes[ray_port + 30]}  # both worker containers, not the head
        assert status["metrics"] == f"127.0.0.1:{metrics_port}"

        # A worker container stops and starts again while objects stream in; more follow. The
        # workers that were on it are revived when a batch needs them, or by the idle service's
        # liveness check (5-10 s after Ray reports the actor dead) when no batch does.
        restart = subprocess.Popen([*script, "restart", "worker1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=env)
        i = 4000
        while restart.poll() is None and i < 7000:
            publish_objects(r, keys, places[i: i + 100])
            i += 100
            time.sleep(0.5)
        assert restart.wait(timeout=300) == 0, restart.stdout.read()
        held = len(places) - 1000  # (published after the idle restart below)
        publish_objects(r, keys, places[i:held])
        wait_processed(r, keys, timeout_s=600)
        assert assert_exact(url, "knn", pa.Table.from_pylist(queries),
                            BruteForceKnn(pa.Table.from_pylist(places[:held]))) == 300
        status, alive, after_busy_s = _workers_on_live_nodes(url, ids["head"], ray_port)
        assert status["workers_revived"] >= 1 and status["worker_restarts"] == 0, _shown_status(status, ids["head"])

        # The other worker container restarts while the service is idle: its workers are revived
        # with no batch to find them, then serve what follows.
        revived = status["workers_revived"]
        restart = subprocess.run([*script, "restart", "worker2"], capture_output=True, text=True, timeout=300, env=env)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        status, alive, after_idle_s = _workers_on_live_nodes(url, ids["head"], ray_port, revived_more_than=revived)
        assert status["worker_restarts"] == 0, _shown_status(status, ids["head"])
        publish_objects(r, keys, places[held:])
        wait_processed(r, keys, timeout_s=600)
        assert assert_exact(url, "knn", pa.Table.from_pylist(queries), BruteForceKnn(pa.Table.from_pylist(places))) \
            == 300
        print(f"cluster: started in {started_s:.0f} s; every worker on a live node {after_busy_s:.0f} s after the "
              f"results (a restart mid-stream), {after_idle_s:.0f} s after an idle restart; "
              f"whole test {time.monotonic() - t0:.0f} s")
    finally:
        down = subprocess.run([*script, "stop"], capture_output=True, text=True, timeout=300, env=env)
        assert down.returncode == 0, down.stderr
        for role, cid in ids.items():
            assert _podman("ps", "--all", "--quiet", "--filter", f"id={cid}").stdout.strip() == "", role


def test_the_worker_image_serves_without_java_or_pyspark(image, places_slice):
    """``deploy/build-image.sh --worker``: the image of a node that only serves (no Java, no
    pyspark) is smaller than the full one, and its ``knnmon serve`` answers a host client exactly.
    (After the full image: its fixture checks the tools and the build.)"""
    from knnmon.client import KnnClient

    out = subprocess.run([str(ROOT / "deploy" / "build-image.sh"), "--base", "--worker"], capture_output=True,
                         text=True, timeout=1800, env=ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    worker = image.replace("knnmon:", "knnmon-worker:")
    sizes = {i: json.loads(_podman("image", "inspect", i).stdout)[0]["Size"] for i in (image, worker)}
    print(f"image sizes: {', '.join(f'{i} {n / 1e9:.2f} GB' for i, n in sizes.items())}")
    assert sizes[worker] < 0.75 * sizes[image]
    probe = _podman("run", "--rm", "--network=host", "--entrypoint", "sh", worker, "-c",
                    "command -v java; python -c 'import pyspark'", timeout=300)
    assert "No module named 'pyspark'" in probe.stderr and "java" not in probe.stdout, probe
    port = free_port_base([0], low=30_000, high=40_000)
    started = _podman("run", "-d", "--network=host", "--shm-size=1g", worker, "serve", "--set",
                      f"redis.port={str(port)}",
                      "--workers", "1", "--metrics", "off", timeout=300)
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip()
    try:
        deadline = time.monotonic() + 300
        while "knnmon serve:" not in (logs := _podman("logs", cid)).stdout:
            gone = "Exited" in _podman("ps", "-a", "--filter", f"id={cid}").stdout
            assert time.monotonic() < deadline and not gone, logs.stdout[-2000:] + logs.stderr[-2000:]
            time.sleep(0.5)
        places = stream_order(read_objects(str(places_slice)), None).slice(0, 500).to_pylist()
        got, want = client_round_trip(KnnClient(f"redis://127.0.0.1:{port}/0"), places, "q", 5)
        assert got == want
    finally:
        _podman("rm", "--force", cid)
