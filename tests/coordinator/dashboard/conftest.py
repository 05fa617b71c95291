"""One running ``knnmon serve`` on a password-protected Redis, with real places and queries, and
one ``knnmon dashboard`` beside it, for the dashboard's tests."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.redis_server import EmbeddedRedis
from tests.support import publish_objects, register_fields, serve_process, wait_processed

#: The Redis password: no page, endpoint or output may show it.
SECRET = "dashboard-s3cret-pw"
NAMESPACE = "dash"


class Served:
    """What the tests read: the Redis URL (with the password), keys, the queries, the places
    published and accepted, the dashboard's address and output file. A test that publishes more
    calls :meth:`publish`, so that :meth:`oracle` stays the oracle of what Redis holds."""

    def __init__(self, url, keys, queries, published, http, log):
        self.url, self.keys, self.queries, self.published = url, keys, queries, published
        self.http, self.log = http, log
        self._oracle = None

    def publish(self, obj: dict) -> None:
        publish_objects(redis.Redis.from_url(self.url, decode_responses=True), self.keys, [obj])
        self.published = [*self.published, obj]
        self._oracle = None

    def oracle(self) -> BruteForceKnn:
        if self._oracle is None:
            self._oracle = BruteForceKnn(pa.Table.from_pylist(self.published))
        return self._oracle


@pytest.fixture(scope="package")
def served(places_slice, slice_queries, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    with EmbeddedRedis(password=SECRET) as server:
        url = server.url
        assert SECRET in url
        r = redis.Redis.from_url(url, decode_responses=True)
        keys = Keys(NAMESPACE)
        queries = pq.read_table(slice_queries).slice(0, 400)
        for q in queries.to_pylist():
            r.xadd(keys.ingest_queries, register_fields(q))
        places = stream_order(read_objects(str(places_slice)), None).slice(0, 4000).to_pylist()
        proc = serve_process(url, NAMESPACE, tmp / "serve.log", "--data-dir", str(tmp / "data"))
        log = tmp / "dashboard.log"
        dash = None
        try:
            wait_processed(r, keys, proc)
            publish_objects(r, keys, places)
            wait_processed(r, keys, proc, timeout_s=300)
            with open(log, "w") as fh:
                dash = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "dashboard", "--redis", url,
                                         "--namespace", NAMESPACE, "--http", "127.0.0.1:0"],
                                        stdout=fh, stderr=subprocess.STDOUT)
            t0 = time.monotonic()
            while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())):  # port 0: it picks one
                assert dash.poll() is None, log.read_text()
                assert time.monotonic() - t0 < 60, "the dashboard did not start"
                time.sleep(0.1)
            http = f"http://127.0.0.1:{found.group(1)}"
            while True:
                try:
                    urllib.request.urlopen(http + "/api/config", timeout=2).read()
                    break
                except OSError:
                    assert dash.poll() is None, log.read_text()
                    assert time.monotonic() - t0 < 60, "the dashboard did not start"
                    time.sleep(0.2)
            rejected = {f.get("id") for _, f in r.xrange(keys.ingest_rejects)}
            yield Served(url, keys, queries, [o for o in places if o["id"] not in rejected], http, log)
        finally:
            if dash is not None:
                dash.send_signal(signal.SIGINT)
                dash.wait(timeout=30)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
