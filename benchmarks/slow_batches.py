"""Benchmark: what the slow batches of a chaos soak spent their time on.

Reads the per-batch log (``knn:serve:batches``) from a copy of a soak's Redis data directory and
the routing table's background rebuilds from its ``serve.log``, and sorts every batch whose update
time exceeds ``--slow-ms`` by what it overlapped: a rebuild of the routing table in the
coordinator (its build runs on a thread of the process that dispatches the batches), a large
refill (``refill_ms`` over half the update), or neither; with the same split for all batches::

    python benchmarks/slow_batches.py --log-dir /tmp/chaos15 --out docs/bench/slow_batches.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from knnmon.connection import connect
from knnmon.keys import Keys
from knnmon.redis_server import EmbeddedRedis

REBUILD = re.compile(r"^(\S+ \S+) knnmon.runtime INFO routing table rebuilt from \d+ queries' regions in ([\d.]+) s"
                     r".*replayed: (\d+) entries")


def rebuilds(serve_log: Path) -> list[tuple[float, float, int]]:
    """``(start ms, end ms, entries)`` of each background rebuild the log reports (local time)."""
    out = []
    for line in serve_log.read_text(errors="replace").splitlines():
        m = REBUILD.match(line)
        if m:
            end = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
            out.append((end - float(m.group(2)) * 1000, end, int(m.group(3))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-dir", required=True, help="the soak's --log-dir (its redis/ and serve.log)")
    ap.add_argument("--namespace", default="chaos")
    ap.add_argument("--slow-ms", type=float, default=1000.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="knnmon-slow-"))
    shutil.copytree(Path(a.log_dir) / "redis", work / "redis", ignore=shutil.ignore_patterns("server.pid"))
    server = EmbeddedRedis(str(work / "redis"), durable=False).start()
    try:
        rows = [f for _, f in connect(server.url).xrange(Keys(a.namespace).serve_batches)]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    built = rebuilds(Path(a.log_dir) / "serve.log")
    rows = [f for f in rows if int(f.get("objects", 0))]
    done = np.array([float(f["done_ms"]) for f in rows])
    update = np.array([float(f["update_ms"]) for f in rows])
    refill = np.array([float(f.get("refill_ms", 0)) for f in rows])
    start = done - update
    in_rebuild = np.zeros(len(rows), dtype=bool)
    for lo, hi, _ in built:
        in_rebuild |= (start < hi) & (done > lo)
    refill_heavy = refill > update / 2
    slow = update > a.slow_ms

    def split(mask: np.ndarray) -> dict:
        n = int(mask.sum())
        return {"batches": n, "during_a_rebuild": int((mask & in_rebuild).sum()),
                "refill_over_half": int((mask & refill_heavy & ~in_rebuild).sum()),
                "neither": int((mask & ~in_rebuild & ~refill_heavy).sum()),
                "update_ms_p50": round(float(np.median(update[mask])), 1) if n else None,
                "update_ms_p99": round(float(np.percentile(update[mask], 99)), 1) if n else None}

    rebuild_s = sum(hi - lo for lo, hi, _ in built) / 1000
    span_s = (done.max() - start.min()) / 1000 if len(rows) else 0.0
    report = {"log_dir": a.log_dir, "slow_ms": a.slow_ms, "all": split(np.ones(len(rows), dtype=bool)),
              "slow": split(slow), "in_rebuild": split(in_rebuild), "not_in_rebuild": split(~in_rebuild),
              "rebuilds": len(built), "rebuild_s_total": round(rebuild_s, 1),
              "share_of_time_rebuilding": round(rebuild_s / span_s, 3) if span_s else None,
              "rebuild_entries": [e for _, _, e in built],
              "slowest": [{k: rows[i].get(k) for k in ("update_ms", "objects", "refilled", "refill_ms", "redis_ms",
                                                      "deliveries", "candidates", "changed")}
                          | {"during_a_rebuild": bool(in_rebuild[i])}
                          for i in np.argsort(-update)[:15].tolist()]}
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
