"""``knnmon serve --metrics``: a real Prometheus server scrapes a running service; its counters
equal what was published and its response-time histogram counts every applied object. The
endpoint's address parsing and the histogram fed in bulk, against the library's own."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.coordinator.runtime.prometheus import RESPONSE_BUCKETS_S, BulkHistogram
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.probes import parse_address
from tests.support import (free_port_base, knnmon_cli, publish_objects, register_fields, serve_process,
                                        wait_processed)
from knnmon.errors import REJECT_REASONS, InvalidArgumentError
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read().decode()


def metrics_address(url: str, namespace: str, timeout_s: float = 120) -> str:
    """The address a running service's ``/metrics`` is bound to, from its status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = knnmon_cli("status", "--json", "--redis", url, "--namespace", namespace)
        service = json.loads(s.stdout)["service"] if s.returncode == 0 else None
        if service and service.get("metrics") and service.get("running", True):
            return service["metrics"]
        time.sleep(0.5)
    raise AssertionError("the service published no metrics address")


def _prometheus_value(api: str, query: str) -> dict[str, float]:
    """The instant vector of ``query`` from Prometheus's HTTP API, by its labels (as JSON)."""
    status, body = _get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert status == 200, body
    return {json.dumps({k: v for k, v in r["metric"].items() if k not in ("instance", "job", "__name__")},
                       sort_keys=True): float(r["value"][1]) for r in json.loads(body)["data"]["result"]}


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus is not installed (the test command installs it as root)")
def test_prometheus_scrapes_what_was_published(redis_url, namespace, places_slice, tmp_path):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    places = stream_order(read_objects(str(places_slice)), None).slice(0, 1500).to_pylist()
    proc = serve_process(redis_url, namespace, tmp_path / "serve.log", "--metrics", "127.0.0.1:0")
    prom = None
    try:
        address = metrics_address(redis_url, namespace)
        for q in places[:3]:
            r.xadd(keys.ingest_queries, register_fields({**q, "id": f"q-{q['id']}", "k": 5}))
        r.xadd(keys.ingest_queries, {"op": "register", "id": "bad-k", "lon": "1", "lat": "1", "keywords": "x",
                                     "k": "0"})
        publish_objects(r, keys, places)
        r.xadd(keys.ingest_objects, {"id": "bad-lon", "lon": "east", "lat": "1", "keywords": "x"})
        wait_processed(r, keys, proc)

        base = free_port_base([0])
        assert base is not None
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: knnmon\n"
            f"    static_configs:\n      - targets: ['{address}']\n")
        with open(tmp_path / "prometheus.log", "w") as log:
            prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{base}"], stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{base}"
        deadline = time.monotonic() + 120
        while True:  # Prometheus answers 503 until its storage is ready (slow on a loaded machine)
            try:
                if _get(f"{api}/-/ready")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        applied: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                applied = _prometheus_value(api, "knnmon_objects_applied_total")
            except (urllib.error.URLError, ConnectionError):
                applied = {}
            if applied.get("{}") == len(places):
                break
            time.sleep(0.5)
        assert applied == {"{}": len(places)}, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert _prometheus_value(api, "knnmon_queries_registered_total") == {"{}": 3}
        # Every reason of both streams has a sample from the start (at 0 until its first reject).
        objects_rejected = _prometheus_value(api, "knnmon_objects_rejected_total")
        queries_rejected = _prometheus_value(api, "knnmon_query_operations_rejected_total")
        assert len(objects_rejected) == len(queries_rejected) == len(REJECT_REASONS)
        assert {k: v for k, v in objects_rejected.items() if v} == {'{"reason": "non_numeric_coordinates"}': 1}
        assert {k: v for k, v in queries_rejected.items() if v} == {'{"reason": "bad_k"}': 1}
        assert queries_rejected['{"reason": "late"}'] == 0
        assert _prometheus_value(api, "knnmon_response_time_seconds_count") == {"{}": len(places)}
        inf = _prometheus_value(api, 'knnmon_response_time_seconds_bucket{le="+Inf"}')
        assert inf == {'{"le": "+Inf"}': len(places)}
        p99 = _prometheus_value(api, "histogram_quantile(0.99, knnmon_response_time_seconds_bucket)")["{}"]
        assert 0 < p99 <= RESPONSE_BUCKETS_S[-1]
        assert _prometheus_value(api, "sum(knnmon_worker_queries)") == {"{}": 3}
        assert _prometheus_value(api, "sum(knnmon_stream_lag_entries)") == {"{}": 0}
        status, ready = _get(f"http://{address}/readyz")
        assert status == 200 and json.loads(ready)["ready"] is True
        assert _get(f"http://{address}/healthz") == (200, "ok\n")
        conn = http.client.HTTPConnection(*parse_address(address), timeout=10)  # (urllib would follow a redirect)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and b"knnmon_objects_applied_total" in resp.read()
        conn.close()
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        proc.terminate()
        proc.wait(timeout=60)


def test_addresses():
    assert parse_address("off") is None and parse_address(" OFF ") is None
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("9464", "host:", ":9464", "host:65536", "host:-1", "host:http"):
        with pytest.raises(InvalidArgumentError, match="--metrics"):
            parse_address(bad)
    for bad in (("127.0.0.1", 70_000), ("127.0.0.1", -1), ("", 9464), ("127.0.0.1", "9464")):
        with pytest.raises(InvalidArgumentError, match="--metrics"):  # the library's settings, not only the CLI
            ServeConfig(metrics=bad)


def test_a_taken_port_fails_the_start_with_a_reason(redis_url, namespace, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = knnmon_cli("serve", "--redis", redis_url, "--namespace", namespace, "--set", "workers.executor=inline",
                         "--metrics", f"127.0.0.1:{port}", "--set", "serve.idle_exit_s=1", timeout=120)
    assert out.returncode != 0
    assert f"--metrics 127.0.0.1:{port} cannot be bound" in out.stderr and "Traceback" not in out.stderr


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=200),
       st.lists(st.sampled_from([0.001, 0.0025, 60.0, float("nan"), float("inf")]), max_size=5))
def test_the_bulk_histogram_exports_what_the_library_would(values, edges):
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    bulk = BulkHistogram("h_seconds", "h", RESPONSE_BUCKETS_S)
    reg = CollectorRegistry()
    reg.register(bulk)
    ref_reg = CollectorRegistry()
    ref = Histogram("h_seconds", "h", buckets=RESPONSE_BUCKETS_S, registry=ref_reg)
    everything = values + edges
    bulk.observe(np.array(everything[: len(everything) // 2]))
    bulk.observe(everything[len(everything) // 2:])
    for v in everything:
        if np.isfinite(v):
            ref.observe(v)
    got = {s.name + str(s.labels): s.value for f in reg.collect() for s in f.samples}
    want = {s.name + str(s.labels): s.value for f in ref_reg.collect() for s in f.samples
            if s.name != "h_seconds_created"}
    assert got.keys() == want.keys()
    for k in got:
        assert got[k] == pytest.approx(want[k]), k
    assert bulk.count == sum(np.isfinite(v) for v in everything)
    assert generate_latest(reg).count(b"h_seconds_bucket") == len(RESPONSE_BUCKETS_S) + 1
