"""Shared fixtures: one real SparkSession per test session, and the real data beside the checkout;
and, before the session, the system packages some tests need (:func:`pytest_sessionstart`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# A `knnmon serve` child of a test binds no metrics port unless the test asks (--metrics):
# services that overlap in time would otherwise contend for the default 127.0.0.1:9464.
os.environ.setdefault("KNNMON_SERVE_METRICS", "off")

#: The project's shared data (``../shared/data`` from the checkout); override with KNNMON_SHARED_DATA.
SHARED_DATA = Path(os.environ.get("KNNMON_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


#: Debian packages the default tests need -> what each provides: Java for Spark (the ingest's
#: tests), Debian's redis-server (built with TLS, with redis-cli 7) and openssl (the TLS and Redis
#: Cluster tests), chromium (the dashboard in a browser), prometheus (a real scrape of the
#: service). Without one of the last four, its tests are skipped.
SYSTEM_PACKAGES = {"openjdk-17-jre-headless": "java", "redis-server": "/usr/bin/redis-server", "openssl": "openssl",
                   "chromium": "chromium", "prometheus": "prometheus"}


def _missing_packages() -> list[str]:
    return [pkg for pkg, cmd in SYSTEM_PACKAGES.items()
            if not (os.access(cmd, os.X_OK) if cmd.startswith("/") else shutil.which(cmd))]


def pytest_sessionstart(session: pytest.Session) -> None:
    """The test command sets itself up: the packages of :data:`SYSTEM_PACKAGES` that are missing
    are installed with apt-get when the tests run as root on Debian (``KNNMON_TEST_NO_INSTALL=1``
    opts out); otherwise one line says which tests are skipped and the command that installs
    them. Runs once, before pytest-xdist starts its workers (they decide the skips)."""
    if hasattr(session.config, "workerinput") or not (missing := _missing_packages()):
        return
    command = f"apt-get install --no-install-recommends {' '.join(missing)}"
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if root and shutil.which("apt-get") and not os.environ.get("KNNMON_TEST_NO_INSTALL"):
        print(f"installing what some tests need: {command}", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, check=False)
        for service in ("redis-server", "prometheus"):  # (tests start their own servers)
            subprocess.run(["service", service, "stop"], capture_output=True, check=False)
        if not (missing := _missing_packages()):
            return
    print(f"tests that need {', '.join(missing)} are skipped; to run them: "
          f"{'' if root else 'sudo '}apt-get install --no-install-recommends {' '.join(missing)}",
          file=sys.stderr, flush=True)


#: Slices of real places committed with the tests (tests/data/README.md): state -> (file, lines).
PLACE_SLICES = {"nh": ("places-us-nh-head6000.geojson.gz", 6000), "vt": ("places-us-vt-head4000.geojson.gz", 4000),
                "de": ("places-us-de-head3000.geojson.gz", 3000), "dc": ("places-us-dc.geojson.gz", 664)}


@pytest.fixture(scope="session")
def place_lines():
    """``place_lines(state, n)``: the first ``n`` lines (GeoJSON Features) of a state's real places,
    from the slices under ``tests/data`` (Rhode Island: all of the package's demo sample). The
    default suite reads nothing else."""
    from tests.support import head_lines

    def lines(state: str, n: int) -> list[str]:
        if state == "ri":
            from importlib.resources import files

            path, have = files("knnmon.data") / "places-sample-ri.geojson.gz", 54_975
        else:
            name, have = PLACE_SLICES[state]
            path = Path(__file__).resolve().parent / "data" / name
        assert n <= have, f"tests/data holds {have} lines of {state}; {n} asked (use shared_data, -m slow)"
        return head_lines(path, n)

    return lines


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``shared/data`` with ``places/`` and ``tweets/``, for ``-m slow`` tests; they skip without it."""
    if not (SHARED_DATA / "places").is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set KNNMON_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 cores), started once; ingest jobs reuse it via getOrCreate."""
    from knnmon.ingest.spark import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()



@pytest.fixture(scope="session")
def places_slice(request, place_lines, tmp_path_factory, worker_id) -> Path:
    """An ingest output of real places: the first 6,000 of New Hampshire and 4,000 of Vermont.
    Ingested once per run: the test processes of a distributed run (pytest-xdist) share it."""
    from filelock import FileLock

    from knnmon.ingest.jobs import ingest_places

    if worker_id == "master":  # (one process: a directory of its own)
        root = tmp_path_factory.mktemp("places_slice")
    else:  # (the run's directory, above each process's own)
        root = tmp_path_factory.getbasetemp().parent / "places_slice"
        root.mkdir(exist_ok=True)
    with FileLock(str(root / "lock")):
        if not (root / "done").exists():
            request.getfixturevalue("spark")
            lines = place_lines("nh", 6000) + place_lines("vt", 4000)
            (root / "in.geojson").write_text("\n".join(lines) + "\n")
            ingest_places([str(root / "in.geojson")], str(root / "objects"), grid_n=32)
            (root / "done").touch()
    return root / "objects"


@pytest.fixture(scope="session")
def slice_queries(places_slice, tmp_path_factory) -> Path:
    """4,000 queries (k <= 10) drawn from :func:`places_slice`."""
    from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
    from knnmon.ingest.reading import read_objects

    path = tmp_path_factory.mktemp("slice_queries") / "queries.parquet"
    write_queries(generate_queries(read_objects(str(places_slice)), QueryWorkload(n=4000, k_max=10, seed=5)), str(path))
    return path


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server (the embedded binary) on a free loopback port, for the whole session."""
    from knnmon.redis_server import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster_url():
    """A real Redis Cluster of 3 masters (the embedded binary) on loopback ports, for the whole
    session; the URL of one node."""
    from knnmon.redis_cluster import LocalCluster

    with LocalCluster(3) as cluster:
        yield cluster.url


@pytest.fixture(params=["standalone", "cluster"])
def store_url(request) -> str:
    """The URL of a standalone Redis, then of a 3-master Redis Cluster (tests of both)."""
    return request.getfixturevalue("redis_url" if request.param == "standalone" else "redis_cluster_url")


@pytest.fixture
def namespace() -> str:
    """A key prefix of this test's own."""
    import uuid

    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance (2 CPUs, small object store) for the session; stopped by shutdown."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 * 1024,
             log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_cluster():
    """``deploy/local-cluster.sh``'s cluster (head + 2 worker nodes, token auth), stopped by PID at
    the end: ``(address, the drivers' environment, the script's environment)``."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.support import free_port_base

    ray_exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    port = free_port_base((0, 10, 20, 30, 100, 300), step=500)  # (the script's block of 400 ports)
    if ray_exe is None or port is None:
        pytest.skip("no ray executable, or no free port block for a local Ray cluster")
    script = Path(__file__).resolve().parents[1] / "deploy" / "local-cluster.sh"
    # (a short directory: Ray's sockets under it must fit AF_UNIX's 107 bytes, which pytest-xdist's
    # base temporary directory would exceed)
    root = Path(tempfile.mkdtemp(prefix="knnmon-cluster-"))
    env = {**os.environ, "KNNMON_CLUSTER_DIR": str(root), "KNNMON_RAY_PORT": str(port), "KNNMON_RAY": ray_exe}
    started = subprocess.run([str(script), "start"], env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    driver_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(root / "auth_token")}
    driver_env.pop("RAY_ADDRESS", None)
    try:
        yield f"127.0.0.1:{port}", driver_env, env
    finally:
        stopped = subprocess.run([str(script), "stop"], env=env, capture_output=True, text=True, timeout=180)
        assert stopped.returncode == 0, stopped.stderr
        assert "running" not in subprocess.run([str(script), "status"], env=env, capture_output=True,
                                               text=True).stdout.replace("NOT running", "")
        shutil.rmtree(root, ignore_errors=True)
