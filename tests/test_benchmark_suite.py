"""The benchmark suite (benchmarks/, pytest-benchmark) runs once at its smoke scale, on real
places, each benchmark's function once: so that it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_suite_runs_at_its_smoke_scale(places_slice):
    env = {**os.environ, "KNNMON_BENCH_OBJECTS": str(places_slice), "KNNMON_BENCH_SCALE": "smoke"}
    p = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-o", "addopts=",
                        "-n", "0", "-q", "--benchmark-disable"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed is not None and int(passed.group(1)) >= 20 and "skipped" not in p.stdout, p.stdout[-2000:]
