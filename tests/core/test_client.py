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


def test_changes_reads_whole_feed_entries_and_skips_foreign_ones(redis_url, namespace):
    """The feed as the writer leaves it (one entry, a line per changed result), read back through
    the client; entries another program put there (wrong fields, no tabs, a huge version) are
    skipped with a warning, not raised."""
    from knnmon.batch import BatchChanges, ObjectInfo
    from knnmon.client import KnnClient
    from knnmon.keys import Keys
    from knnmon.workers.result_writer import ResultWriter

    obj = {f"o{i}": ObjectInfo(-71.0, 41.0, 1, ["coffee"]) for i in range(3)}
    writer = ResultWriter(redis_url, namespace, 0)
    writer.write_queries(-1, [("q1", {"k": 2}, [("o0", 1.0)]), ("q2", {"k": 1}, [("o1", 2.0)])], obj)
    client = KnnClient(redis_url, namespace=namespace)
    r = client.client
    for junk in ({"qid": "q1", "entered": "o9"}, {"version": "x", "changes": "q1\t\t"},
                 {"version": "1", "changes": "no tabs here"}):
        r.xadd(Keys(namespace).changes, junk)
    writer.write_batch(0, BatchChanges.from_diffs([("q1", [("o2", 0.5)], ["o0"])], obj, 1))
    got = client.changes()
    assert [(c.qid, c.entered, c.left, c.version) for c in got] == [
        ("q1", ["o0"], [], 0), ("q2", ["o1"], [], 0), ("q1", ["o2"], ["o0"], 1)]
    assert client.changes(since=got[1].entry_id, count=1) == got[2:]
    assert client.changes(count=0) == [] and client.changes(since=got[2].entry_id) == []
    writer.close()
    client.close()
