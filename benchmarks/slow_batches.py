"""Benchmark: where the service loop's time went in a chaos soak, minute by minute, and what its
longest steps overlapped.

Reads the per-batch log (``knn:serve:batches``) from a copy of a soak's Redis data directory, and
from its ``serve.log`` the routing table's background rebuilds, the checkpoints and the revivals
(with the soak's JSON, ``--soak``: its start and its injected faults). The loop runs one batch at
a time: each batch occupies ``[done - parse - update, done]``, and the time between one batch's
end and the next one's start (a *gap*) is the loop's other work (reading and parsing the streams,
query registrations, checkpoints, revivals, the routing table's swap). Per minute of publishing it
reports the latency p99 and the seconds of update, refill search, update during a rebuild of the
routing table, gaps and gaps holding a checkpoint; then the longest single steps (an update or a
gap over ``--slow-ms``) with what each overlapped::

    python benchmarks/slow_batches.py --log-dir /tmp/chaos15 --soak /tmp/chaos15.json \\
        --out /tmp/knnmon-bench/slow_batches.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from knnmon.connection import connect
from knnmon.coordinator.service import latency
from knnmon.keys import Keys
from knnmon.redis_server import EmbeddedRedis

STAMP = r"^(\S+ \S+) knnmon\.\w+ \w+ "
REBUILD = re.compile(STAMP + r"routing table rebuilt from \d+ queries' regions in ([\d.]+) s.*replayed: (\d+) entries")
CHECKPOINT = re.compile(STAMP + r"checkpoint: .*?(?:in ([\d.]+) s)?$")
REVIVAL = re.compile(STAMP + r"worker \d+ revived: .* in ([\d.]+) s \(")


def _ms(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000


def log_spans(serve_log: Path) -> dict[str, list[tuple[float, float, int]]]:
    """``{kind: [(start ms, end ms, entries or 0), ...]}`` of the rebuilds, checkpoints (an older
    log without their duration: a point) and revivals ``serve.log`` reports (local time)."""
    out: dict[str, list[tuple[float, float, int]]] = {"rebuild": [], "checkpoint": [], "revival": []}
    for line in serve_log.read_text(errors="replace").splitlines():
        for kind, rx in (("rebuild", REBUILD), ("checkpoint", CHECKPOINT), ("revival", REVIVAL)):
            m = rx.match(line)
            if m:
                end, took = _ms(m.group(1)), float(m.group(2) or 0.0)
                out[kind].append((end - took * 1000, end, int(m.group(3)) if kind == "rebuild" else 0))
                break
    return out


def overlapping(lo: float, hi: float, spans: dict[str, list[tuple[float, float, int]]]) -> list[str]:
    """The kinds of span that overlap ``[lo, hi]`` (ms), a point span counting when inside it."""
    return sorted(k for k, ss in spans.items() if any(a <= hi and b >= lo for a, b, _ in ss))


def overlap_ms(lo: np.ndarray, hi: np.ndarray, spans: list[tuple[float, float, int]]) -> np.ndarray:
    """``(n,)`` ms of each interval ``[lo, hi]`` covered by ``spans``."""
    out = np.zeros(len(lo))
    for a, b, _ in spans:
        out += np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None)
    return out


def read_batches(log_dir: Path, namespace: str) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="knnmon-slow-"))
    shutil.copytree(log_dir / "redis", work / "redis", ignore=shutil.ignore_patterns("server.pid"))
    server = EmbeddedRedis(str(work / "redis"), durable=False).start()
    try:
        return [f for _, f in connect(server.url).xrange(Keys(namespace).serve_batches)]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-dir", required=True, help="the soak's --log-dir (its redis/ and serve.log)")
    ap.add_argument("--soak", help="the soak's JSON report (its start and faults)")
    ap.add_argument("--start-ms", type=float, help="the publishing's start, epoch ms (a report without start_ms)")
    ap.add_argument("--namespace", default="chaos")
    ap.add_argument("--slow-ms", type=float, default=500.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = [f for f in read_batches(Path(a.log_dir), a.namespace) if int(f.get("objects", 0))]
    if not rows:
        sys.exit("no batch with objects in the log")
    spans = log_spans(Path(a.log_dir) / "serve.log")
    soak = json.loads(Path(a.soak).read_text()) if a.soak else {}
    col = {k: np.array([float(f.get(k, 0) or 0) for f in rows])
           for k in ("done_ms", "update_ms", "parse_ms", "refill_ms", "busy_max_ms")}
    done, update = col["done_ms"], col["update_ms"]
    start = done - update - col["parse_ms"]
    order = np.argsort(start, kind="stable")
    gap_lo, gap_hi = done[order][:-1], start[order][1:]
    gap = np.clip(gap_hi - gap_lo, 0, None)
    soak["start_ms"] = a.start_ms or soak.get("start_ms")
    t0 = float(soak["start_ms"] or start.min())
    if soak["start_ms"]:
        spans["fault"] = [(t0 + e["at_s"] * 1000, t0 + (e["at_s"] + (e.get("served_again_s") or 0)) * 1000, 0)
                          for e in soak.get("events", [])]
    rebuild_ms = overlap_ms(start, done, spans["rebuild"])
    ckpt_gap_ms = overlap_ms(gap_lo, gap_hi, spans["checkpoint"])
    minute, gap_minute = ((start - t0) // 60_000).astype(int), ((gap_lo - t0) // 60_000).astype(int)
    hists = [latency.decode([f.get("lat_hist", "")]) for f in rows]
    top = np.array([latency.midpoints()[np.flatnonzero(h)[-1]] if h.any() else 0.0 for h in hists])
    minutes = []
    for m in range(max(0, minute.min()), minute.max() + 1):
        sel, gsel = minute == m, gap_minute == m
        if not sel.any():
            continue
        hist = np.sum([hists[i] for i in np.flatnonzero(sel)], axis=0)
        minutes.append({"minute": m, "latency_ms_p99": round(latency.percentile(hist, 99)),
                        "batches": int(sel.sum()), "update_s": round(update[sel].sum() / 1e3, 1),
                        "refill_s": round(col["refill_ms"][sel].sum() / 1e3, 1),
                        "update_in_rebuild_s": round(update[sel & (rebuild_ms > 0)].sum() / 1e3, 1),
                        "busy_max_s": round(col["busy_max_ms"][sel].sum() / 1e3, 1),
                        "gaps_s": round(gap[gsel].sum() / 1e3, 1), "gaps_in_checkpoint_s": round(
                            ckpt_gap_ms[gsel].sum() / 1e3, 1), "faults": overlapping(
                            t0 + m * 60_000, t0 + (m + 1) * 60_000, {"fault": spans.get("fault", [])})})
    steps = [("update", float(start[i]), float(done[i]), i) for i in np.flatnonzero(update > a.slow_ms)]
    steps += [("gap", float(gap_lo[j]), float(gap_hi[j]), int(order[j + 1])) for j in np.flatnonzero(gap > a.slow_ms)]
    steps.sort(key=lambda s: -(s[2] - s[1]))
    over = [overlapping(lo, hi, spans) for _, lo, hi, _ in steps]
    longest = [{"kind": kind, "minute": round((lo - t0) / 60_000, 2), "ms": round(hi - lo),
                "overlaps": what, "next_batch_latency_ms_max": round(float(top[i]))}
               | {k: rows[i].get(k) for k in ("objects", "refilled", "refill_ms", "route_ms", "busy_max_ms",
                                              "busy_wall_max_ms", "redis_ms", "deliveries", "candidates")}
               for (kind, lo, hi, i), what in zip(steps[:40], over)]
    by_kind: dict[str, Counter] = {}
    for (kind, _, _, _), what in zip(steps, over):
        by_kind.setdefault(kind, Counter())["+".join(what) or "none"] += 1
    report = {"log_dir": a.log_dir, "slow_ms": a.slow_ms, "batches": len(rows),
              "steps_over_slow_ms": by_kind, "rebuilds": len(spans["rebuild"]),
              "rebuild_entries": [e for _, _, e in spans["rebuild"]], "minutes": minutes, "longest": longest}
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
