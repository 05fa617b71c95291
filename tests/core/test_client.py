"""The Python client is light: ``from knnmon.client import KnnClient`` loads no heavy package.

Its round trip against a running service is in ``tests/coordinator/service/test_loop.py``.
"""

from __future__ import annotations

import subprocess
import sys


def test_the_python_client_imports_no_heavy_package():
    code = ("import sys; from knnmon.client import KnnClient; "
            "heavy = {'ray', 'pyspark', 'numpy', 'pyarrow'} & set(sys.modules); print(sorted(heavy))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
