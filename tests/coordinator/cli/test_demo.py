"""``knnmon demo``: the README's main job, on the bundled sample, through Ray and Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from knnmon.coordinator.cli.demo import run_demo, sample_places_path
from knnmon.redis_server import EmbeddedRedis


def test_sample_ships_with_the_package():
    assert os.path.getsize(sample_places_path()) <= 5 * 1024 * 1024


def test_demo_runs_on_the_bundled_sample(spark, ray_instance, tmp_path, capsys):
    result = run_demo(str(tmp_path), n_queries=300, k_max=5, show=3)
    m, s = result.manifest, result.summary
    assert m.records.read == 54_975 and m.records.kept > 54_000
    assert s.objects + s.initial_objects == m.records.kept and s.results_changed > 0
    assert len(result.shown) == 3
    for q, knn, exact in result.shown:
        assert exact and 1 <= len(knn) <= q["k"]
        assert [o["distance_m"] for o in knn] == sorted(o["distance_m"] for o in knn)
    out = capsys.readouterr().out
    assert "equals the brute-force kNN" in out and result.shown[0][1][0]["id"] in out
    assert os.path.exists(tmp_path / "data" / "redis" / "knnmon.rdb")  # saved for `knnmon results`
    # `knnmon demo --dashboard` then serves the dashboard on the saved results (dashboard_on), as
    # `knnmon dashboard --data-dir` does: the demo's queries and their kNN.
    proc = subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "dashboard", "--data-dir",
                             str(tmp_path / "data"), "--http", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())  # port 0: it picks a free one
        assert found, "the dashboard printed no address"
        port = int(found.group(1))
        t0 = time.monotonic()
        while True:
            try:
                queries = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/queries", timeout=10))
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() - t0 < 60
                time.sleep(0.2)
        assert queries["registered"] == 300
        q, knn, _ = result.shown[0]
        got = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/results/{q['id']}", timeout=10))
        assert [o["id"] for o in got["result"]] == [o["id"] for o in knn]
    finally:
        proc.send_signal(signal.SIGTERM)  # (what systemd and Kubernetes send: it stops as on Ctrl-C)
        proc.wait(timeout=30)
    assert proc.returncode == 143
    assert EmbeddedRedis.running(str(tmp_path / "data" / "redis")) is None  # its embedded Redis stopped too
