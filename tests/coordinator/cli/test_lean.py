"""A node that only serves needs neither pyspark nor Java (``pip install knnmon``; ingest is the
``spark`` extra): ``knnmon serve`` on a Ray worker answers exactly with pyspark unimportable and
no ``java`` on ``PATH``, and ``knnmon ingest`` names the extra instead of failing on an import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from knnmon.client import KnnClient
from knnmon.ingest.reading import read_objects, stream_order
from tests.support import client_round_trip

ROOT = Path(__file__).resolve().parents[3]

#: Makes pyspark unimportable in every process started with it on PYTHONPATH (Ray's workers too).
BLOCK = '''import sys

class _NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r} (a lean install: test)", name=name)
        return None

sys.meta_path.insert(0, _NoSpark())
'''


def _lean_env(tmp_path: Path) -> dict[str, str]:
    """This environment with pyspark blocked and no directory holding ``java`` on PATH."""
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK)
    env = {k: v for k, v in os.environ.items() if k not in ("KNNMON_REDIS_URL", "JAVA_HOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "block"), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.path.dirname(sys.executable)
    assert shutil.which("java", path=env["PATH"]) is None
    return env


def test_pyspark_is_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert not any(d.startswith("pyspark") for d in project["dependencies"])
    assert any(d.startswith("pyspark") for d in project["optional-dependencies"]["spark"])


def test_serve_on_ray_without_pyspark_or_java(tmp_path, redis_url, namespace, places_slice):
    env = _lean_env(tmp_path)
    cli = [sys.executable, "-m", "knnmon.coordinator.cli"]
    ingest = subprocess.run([*cli, "ingest", "places", str(tmp_path), "--out", str(tmp_path / "o")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert ingest.returncode == 2 and "pip install 'knnmon[spark]'" in ingest.stderr, ingest.stderr
    log = tmp_path / "serve.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([*cli, "serve", "--redis", redis_url, "--namespace", namespace, "--workers", "1",
                                 "--metrics", "off"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        places = stream_order(read_objects(str(places_slice)), None).slice(0, 500).to_pylist()
        got, want = client_round_trip(KnnClient(redis_url, namespace=namespace), places, "q", 5)
        assert got == want, log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while "starting 1 workers on" not in log.read_text():  # (the workers were Ray actors)
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert "pyspark" not in log.read_text()
