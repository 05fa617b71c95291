"""TLS and AUTH end to end against a real TLS-enabled ``redis-server`` (Debian's; ``.ci/run``
installs it): ``knnmon run`` with Ray workers and ``knnmon serve`` with the client stay exact, over
``rediss://`` with a CA, and the password appears in no output, report or key."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from knnmon.client import KnnClient
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.redis_server import free_port
from tests.support import client_round_trip, dump_keys, knnmon_cli, run_exact, serve_process

SECRET = "tls-Secret-9001"
SYSTEM_REDIS = "/usr/bin/redis-server"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """A TLS-only redis-server on a loopback port, requiring ``SECRET``; its URL carries the CA."""
    if not os.access(SYSTEM_REDIS, os.X_OK) or shutil.which("openssl") is None:
        pytest.skip(f"needs Debian's redis-server (built with TLS) at {SYSTEM_REDIS} and openssl: the test command "
                    "installs them as root (tests/conftest.py)")
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=knnmon test CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out",
             "server.csr", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "san.ext", "-out", "server.crt", cwd=d)
    port = free_port()
    proc = subprocess.Popen([SYSTEM_REDIS, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(d / "server.crt"), "--tls-key-file", str(d / "server.key"),
                             "--tls-ca-cert-file", str(d / "ca.crt"), "--tls-auth-clients", "no",
                             "--requirepass", SECRET, "--dir", str(d), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"rediss://:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if redis.Redis.from_url(url).ping():
                break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the TLS redis-server did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_plain_connections_are_refused_and_tls_with_the_ca_works(tls_redis):
    port = tls_redis.split(":")[3].split("/")[0]
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=int(port), password=SECRET, socket_timeout=2).ping()
    assert redis.Redis.from_url(tls_redis).ping()


@pytest.mark.slow  # 20 s; the default suite checks the TLS connection above and the password in test_secrets.py
def test_run_and_serve_over_tls_are_exact_and_never_show_the_password(tls_redis, places_slice, slice_queries,
                                                                      namespace, tmp_path):
    run, report = run_exact(tls_redis, namespace, str(places_slice), load_queries(str(slice_queries)).slice(0, 200),
                            tmp_path)
    objects = stream_order(read_objects(str(places_slice)), None)
    served = f"{namespace}s"
    proc = serve_process(tls_redis, served, tmp_path / "serve.log")
    try:
        got, want = client_round_trip(KnnClient(tls_redis, served), objects.slice(0, 2000).to_pylist(), "t1", 6)
        assert got == want
        status = knnmon_cli("status", "--redis", tls_redis, "--namespace", served)
        results = knnmon_cli("results", "t1", "--json", "--redis", tls_redis, "--namespace", served)
        assert status.returncode == 0 and results.returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for text in (run.stdout, run.stderr, report, (tmp_path / "serve.log").read_text(), status.stdout,
                 status.stderr, results.stdout, results.stderr):
        assert SECRET not in text
    assert SECRET not in dump_keys(redis.Redis.from_url(tls_redis, decode_responses=True), f"{namespace}*")
