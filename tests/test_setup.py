"""The test command sets itself up (tests/conftest.py): a missing system package is installed as
root on Debian, or named in one line with the command that installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_package_is_named_with_its_install_command():
    code = ("import sys; sys.path.insert(0, 'tests'); import conftest\n"
            "conftest.SYSTEM_PACKAGES['knnmon-test-absent'] = 'knnmon-test-absent-command'\n"
            "conftest.pytest_sessionstart(type('S', (), {'config': object()})())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KNNMON_TEST_NO_INSTALL": "1"})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "knnmon-test-absent are skipped" in lines[0], lines
    assert "apt-get install --no-install-recommends knnmon-test-absent" in lines[0]
