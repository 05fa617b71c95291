"""Benchmark: a windowed worker's revival from its stored results (first ``k`` of each list, read
from Redis: ``serve``'s way) against one over the live objects (each list's ``k + reserve``
searched again, Redis repaired), in one sitting (issue 35: a revived worker's lists lack their
reserve until refills bring it back).

Runs ``benchmarks/worker_loss.py`` twice with the same arguments: once as is, once with the
revival's read of the members' details made to find none (``revival.held_details`` returns
``None``), which sends it over the live objects. Writes ``<out>.stored.json`` and
``<out>.live.json`` (each with the revival's steps and the sampled oracle check) and prints both
revivals::

    python benchmarks/revival_paths.py --out /tmp/revival -- --objects /tmp/full \\
        --queries /tmp/q110k.parquet --workers 4 --initial 600000 --batches 20 --kill-at 10 \\
        --window 600000 --arrival-ms 1 --check-sample 500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIVE = ("import runpy, sys; import knnmon.coordinator.recovery.revival as r; "
        "r.held_details = lambda hashes, members: None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="prefix of the two reports")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- worker_loss.py's arguments (without --out)")
    a = ap.parse_args()
    rest = [x for x in a.rest if x != "--"]
    script = os.path.join(HERE, "worker_loss.py")
    for name, head in (("stored", [script]), ("live", ["-c", LIVE, script])):
        out = f"{a.out}.{name}.json"
        subprocess.run([sys.executable, *head, *rest, "--out", out], check=True, stdout=subprocess.DEVNULL)
        rep = json.load(open(out))
        print(name, json.dumps({k: rep.get(k) for k in ("queries_on_lost_worker", "batch_with_loss_s", "revivals",
                                                          "checked_queries", "mismatched_queries")}))


if __name__ == "__main__":
    main()
