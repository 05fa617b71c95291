"""Profile the coordinator's routing of each batch (``Dispatcher.dispatch``) in a run shaped like
``benchmarks/paper_scale.py``'s (``W`` Ray workers, ``in_flight = 1``, an embedded Redis):
cProfile is on only inside ``dispatch``, and the top functions by own and cumulative time are
printed (issue 37: routing is about half of the simulated update time at 1 M queries).

    python benchmarks/dispatch_profile.py --objects /tmp/synth20m --queries /tmp/sq1m.parquet \\
        --n 1000000 --workers 12 --algorithm proposed > /tmp/knnmon-bench/profiles/dispatch_1m_proposed.txt

The profiler's own cost per call inflates the many small calls (a dict lookup per distinct
keyword, each Ray call's Python); compare the shares between plans, not the times with
unprofiled runs. ``--sections`` instead times the dispatch's parts by thread CPU, with no
profiler (a wrapper per part, about a microsecond each), and prints ms per batch::

    python benchmarks/dispatch_profile.py --objects /tmp/synth20m --queries /tmp/sq1m.parquet \
        --n 1000000 --workers 12 --sections
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import defaultdict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--algorithm", default="proposed")
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sections", action="store_true", help="time the dispatch's parts (thread CPU), no profiler")
    a = p.parse_args()

    from knnmon.coordinator.runtime import dispatch
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.ingest.reading import load_queries
    from knnmon.store import StoreConfig

    queries = load_queries(a.queries).slice(0, a.n)
    config = RunConfig(workers=a.workers, algorithm=a.algorithm, initial=a.initial, batch=1000, batches=a.batches,
                       in_flight=1, store=StoreConfig(namespace="profile", data_dir=None))
    if a.sections:
        return _sections(a, queries, config)
    prof = cProfile.Profile()
    plain = dispatch.Dispatcher.dispatch

    def profiled(self, batch):
        prof.enable()
        try:
            return plain(self, batch)
        finally:
            prof.disable()

    dispatch.Dispatcher.dispatch = profiled
    with Runtime(a.objects, queries, config) as rt:
        s = rt.run(progress=False)
    print(f"{a.algorithm} n={a.n:,} W={a.workers}: route_cpu_ms_mean {s.route_cpu_ms_mean:.1f}, "
          f"sim {s.update_ms_sim_mean:.1f} ms (profiled)")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
        print(out.getvalue())


def _sections(a, queries, config) -> None:
    """Run with the dispatch's parts wrapped in thread-CPU timers; print ms per batch of each."""
    from knnmon.assignment.routing import RoutingTable
    from knnmon.batch import ObjectBatch
    from knnmon.coordinator.runtime import dispatch
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.coordinator.runtime.worker_pool import RayPool

    spent: dict[str, float] = defaultdict(float)
    inside = [False]  # only the calls within a dispatch count (the plan and the load route too)

    def timed(owner, name: str, label: str) -> None:
        plain = getattr(owner, name)
        outer = label.startswith("dispatch")

        def wrapper(*args, **kwargs):
            if not (inside[0] or outer):
                return plain(*args, **kwargs)
            inside[0] = True
            c0 = time.thread_time()
            try:
                return plain(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - c0
                inside[0] = inside[0] and not outer

        setattr(owner, name, wrapper)

    for owner, name, label in ((dispatch.Dispatcher, "dispatch", "dispatch (all)"),
                               (dispatch.Dispatcher, "drop_seen", "drop duplicates"),
                               (RoutingTable, "encode", "keyword codes"),
                               (RoutingTable, "route_v", "worker bitmasks"),
                               (dispatch.Dispatcher, "_route", "routing (codes, cells, bitmasks, table)"),
                               (RayPool, "share", "ray.put of the batch"),
                               (RayPool, "process", "worker calls"),
                               (ObjectBatch, "rows_of", "rows per worker")):
        timed(owner, name, label)
    with Runtime(a.objects, queries, config) as rt:
        s = rt.run(progress=False)
        batches = len(rt.reports)
    print(f"{a.algorithm} n={a.n:,} W={a.workers}: route_cpu_ms_mean {s.route_cpu_ms_mean:.1f}, "
          f"sim {s.update_ms_sim_mean:.1f} ms; thread CPU ms per batch:")
    for label, sec in spent.items():
        print(f"  {label:24s} {sec / max(batches, 1) * 1e3:7.2f}")


if __name__ == "__main__":
    main()
