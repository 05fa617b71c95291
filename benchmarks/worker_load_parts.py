"""What a Ray worker keeps after its initial load, by the size of the load's parts.

A worker takes its initial queries in calls of ``LOAD_CHUNK`` queries
(:meth:`knnmon.coordinator.runtime.registration.Registrar.load`). Each call's arguments (the
queries' ids and keywords, their initial kNN as lists of ``(id, distance)`` tuples, the objects'
details) are unpickled in the worker, among what it keeps, and Python's small-object allocator
hands back only whole 1 MiB arenas: the memory left over after a load grows with the part.

For each part count, one fresh :class:`~knnmon.workers.worker.KnnWorker` actor (writing to an
embedded Redis, as in a run) loads the first ``--queries-n`` queries of a query file with their
exact initial kNN over the first ``--initial`` objects, in that many calls; an idle actor started
beside it is the baseline. Reported per part count: the worker's anonymous RSS (``RssAnon``: its
own heap; the pages of Ray's object store it read are shared and not counted) over the idle
one's, per query, and Python's arenas (``sys._debugmallocstats``) against its live small objects.

    python benchmarks/worker_load_parts.py --objects /tmp/synth20m --queries /tmp/sq3m.parquet \\
        --queries-n 40000 --parts 1,8,20 --report /tmp/knnmon-bench/worker_load_parts.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile

import pyarrow.parquet as pq

from knnmon.coordinator.bench.worker_load import initial_load
from knnmon.ingest.reading import OBJECT_COLUMNS, stream_head
from knnmon.query import QueryColumns
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.settings import WorkerSettings
from knnmon.workers.worker import KnnWorker

ARENA_LINES = ("# arenas allocated current", "# bytes in allocated blocks")


class ProbedWorker(KnnWorker):
    """A worker that also reports its allocator's state."""

    def allocator(self) -> dict[str, int]:
        """Python's arenas now and the bytes of live small objects in them."""
        fd, path = tempfile.mkstemp()
        saved = os.dup(2)
        os.dup2(fd, 2)
        try:
            sys._debugmallocstats()  # writes to the C stderr
        finally:
            os.dup2(saved, 2)
            os.close(fd)
            os.close(saved)
        with open(path, encoding="ascii") as fh:
            lines = [line for line in fh if line.startswith(ARENA_LINES)]
        os.unlink(path)
        return {key: int(line.split("=")[1].replace(",", "")) for key, line in zip(("arenas", "live_bytes"), lines)}


def main(argv: list[str] | None = None) -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--queries-n", type=int, default=40_000)
    ap.add_argument("--initial", type=int, default=200_000)
    ap.add_argument("--parts", default="1,8,20", help="part counts, comma-separated")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    initial = stream_head(a.objects, a.initial, OBJECT_COLUMNS)
    q = pq.read_table(a.queries).slice(0, a.queries_n)
    n = q.num_rows
    cols, topk, info = initial_load(initial, q)
    out = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
           "command": " ".join(sys.argv), "queries": n, "rows": []}
    ray.init(num_cpus=2, include_dashboard=False)
    actor = ray.remote(ProbedWorker).options(num_cpus=0.001)
    with EmbeddedRedis() as server:
        for parts in [int(x) for x in a.parts.split(",")]:
            idle = actor.remote(1, WorkerSettings(server.url, f"parts{parts}-idle"))
            w = actor.remote(0, WorkerSettings(server.url, f"parts{parts}"))
            step = -(-n // parts)
            for s in range(0, n, step):
                e = min(n, s + step)
                used = {o for t in topk[s:e] for o, _ in t}
                ray.get(w.load_queries.remote(
                    QueryColumns(cols.ids[s:e], cols.lon[s:e], cols.lat[s:e], cols.keywords[s:e], cols.k[s:e]),
                    topk[s:e], {o: v for o, v in info.items() if o in used}, rebuild=e == n))
            st, st0 = ray.get(w.stats.remote()), ray.get(idle.stats.remote())
            al, al0 = ray.get(w.allocator.remote()), ray.get(idle.allocator.remote())
            row = {"parts": parts, "queries_per_part": step, "rss_anon_mb": round(st.rss_anon_mb, 1),
                   "idle_rss_anon_mb": round(st0.rss_anon_mb, 1),
                   "kept_mb": round(st.rss_anon_mb - st0.rss_anon_mb, 1),
                   "kept_bytes_per_query": round((st.rss_anon_mb - st0.rss_anon_mb) * 2**20 / n),
                   "arenas_mb_over_idle": al["arenas"] - al0["arenas"],  # 1 MiB each
                   "live_small_objects_mb_over_idle": round((al["live_bytes"] - al0["live_bytes"]) / 2**20, 1)}
            out["rows"].append(row)
            print(row, flush=True)
            ray.kill(idle)
            ray.kill(w)
    ray.shutdown()
    if a.report:
        with open(a.report, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
