"""A restart's read of the objects stream, parsed whole against taken from the checkpoints'
chunks (``coordinator/recovery/object_snapshot.py``), over a copy of a soak's Redis.

The copy's acknowledged entries are cut into chunks of ``--chunk-entries`` as the checkpoints
would write them (each chunk: the objects its range's parse accepts), then the read is timed
``--repeat`` times each way, alternating, and the two reads are compared (same objects, pending
entries, rejects). The copy is not changed: the chunks go to a scratch copy of it.

    python benchmarks/snapshot_read.py --redis-dir /tmp/chaos11/redis --namespace chaos --window 10m
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from knnmon.connection import connect
from knnmon.window import parse_duration
from knnmon.coordinator.recovery.object_log import OBJECT_SCHEMA, read_objects
from knnmon.coordinator.recovery.object_snapshot import Chunk, encode
from knnmon.heap import bulk_build
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS
from knnmon.protocol import GROUP
from knnmon.redis_server import EmbeddedRedis


def write_chunks(client, keys: Keys, chunk_entries: int) -> int:
    """Chunks of the acknowledged entries, each holding what parsing its range accepts."""
    from knnmon.bulk_parse import parse_objects
    import pyarrow as pa
    import numpy as np

    first_pending = client.xpending(keys.ingest_objects, GROUP).get("min")
    end = "(" + first_pending if first_pending else client.xinfo_groups(keys.ingest_objects)[0]["last-delivered-id"]
    start, n, seen = "-", 0, set()
    while True:
        entries = client.xrange(keys.ingest_objects, min=start, max=end, count=chunk_entries)
        if not entries:
            return n
        cols = parse_objects(entries, DEFAULT_LIMITS)
        take = []
        for i in np.flatnonzero(cols.ok).tolist():
            if cols.ids[i] not in seen:
                seen.add(cols.ids[i])
                take.append(i)
        rows = np.asarray(take, dtype=np.int64)
        objects = pa.table({"id": pa.array([cols.ids[i] for i in take], pa.string()), "lon": cols.lon[rows],
                            "lat": cols.lat[rows], "t": cols.t[rows],
                            "keywords": pa.array([list(cols.keywords[i]) for i in take], pa.list_(pa.string()))},
                           schema=OBJECT_SCHEMA)
        top = int(cols.t[rows].max()) if take else -(1 << 63)
        chunk = Chunk(entries[0][0], entries[-1][0], [(entries[0][0], entries[-1][0], top)], objects)
        client.hset(keys.serve_snapshot, chunk.last, encode(chunk, DEFAULT_LIMITS))
        n += 1
        if len(entries) < chunk_entries:
            return n
        start = "(" + entries[-1][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-dir", required=True)
    ap.add_argument("--namespace", default="chaos")
    ap.add_argument("--window", default="10m")
    ap.add_argument("--chunk-entries", type=int, default=60_000, help="entries per chunk (a minute at 1,000/s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    window = parse_duration(a.window)
    work = Path(tempfile.mkdtemp(prefix="knnmon-snapshot-read-"))
    shutil.copytree(a.redis_dir, work / "redis", ignore=shutil.ignore_patterns("server.pid"))
    server = EmbeddedRedis(str(work / "redis"), durable=True).start()
    try:
        client, keys = connect(server.url), Keys(a.namespace)
        client.delete(keys.serve_snapshot)
        t0 = time.perf_counter()
        chunks = write_chunks(client, keys, a.chunk_entries)
        written_s = time.perf_counter() - t0
        saved = client.hgetall(keys.serve_snapshot)
        size = sum(len(v) for v in saved.values())
        times: dict[str, list[float]] = {"parsed": [], "chunks": []}
        logs = {}
        for _ in range(a.repeat):
            for how in ("parsed", "chunks"):
                client.delete(keys.serve_snapshot)
                if how == "chunks":
                    client.hset(keys.serve_snapshot, mapping=saved)
                with bulk_build():
                    t0 = time.perf_counter()
                    logs[how] = read_objects(client, keys, OBJECT_SCHEMA.empty_table(), DEFAULT_LIMITS, frozenset(),
                                             window, 0)
                    times[how].append(round(time.perf_counter() - t0, 2))
        a_, b_ = logs["parsed"], logs["chunks"]
        same = (a_.objects.sort_by("id").equals(b_.objects.sort_by("id")) and a_.pending == b_.pending
                and [(e, r.reason) for e, _, r in a_.rejects] == [(e, r.reason) for e, _, r in b_.rejects])
        out = {"args": vars(a), "date": time.strftime("%Y-%m-%d %H:%M"), "entries": client.xlen(keys.ingest_objects),
               "live_objects": a_.objects.num_rows, "chunks": chunks, "chunks_mb": round(size / 2**20, 1),
               "chunks_written_s": round(written_s, 2), "read_s": times, "same": same}
        print(json.dumps(out, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
