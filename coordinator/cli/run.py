"""``knnmon run``: stream a data set through the distributed runtime; results go to Redis."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from knnmon.coordinator.cli.options import (add_verb, announce_first_compile, add_batch_option, add_cost_model_option,
                                            add_index_option,
                                            add_limit_options, add_log_format_option, add_routing_entries_option,
                                            add_store_options, add_window_options, add_rebalance_options,
                                            add_worker_options, runtime_settings, store_config)

__all__ = ["add_run_command", "format_run_summary"]


def format_run_summary(s: Any) -> str:
    """A :class:`~knnmon.coordinator.runtime.metrics.RunSummary` as a few readable lines."""
    return "\n".join([
        f"{s.algorithm} on {s.workers} workers: {s.queries:,} queries, {s.initial_objects:,} initial objects, "
        f"{s.objects:,} streamed in {s.batches} batches ({s.duplicates_ignored} duplicate ids ignored)",
        f"throughput {s.objects_per_s:,.0f} objects/s end to end ({s.wall_s:.1f} s)",
        f"update time per batch: mean {s.update_ms_mean:.1f} ms, p50 {s.update_ms_p50:.1f} ms, "
        f"p99 {s.update_ms_p99:.1f} ms; load imbalance (busiest - idlest worker) {s.imbalance_ms_mean:.1f} ms",
        f"deliveries per object {s.deliveries_per_object:.2f}; results changed {s.results_changed:,}; "
        f"candidate pairs checked {s.candidates:,}"
        + (f" ({s.candidates_per_change:.1f} per change)" if s.candidates_per_change else ""),
        f"Redis server time per batch (result scripts, serial): mean {s.redis_server_ms_mean:.1f} ms, "
        f"p99 {s.redis_server_ms_p99:.1f} ms",
        f"results in Redis: {s.results_store} (namespace {s.config['store']['namespace']!r})",
    ] + ([f"workers lost and revived: {s.workers_revived}"] if s.workers_revived else [])
      + ([f"re-balancing: {len(s.replans)} re-plans moved {s.queries_moved:,} queries; slowest / mean worker busy "
          f"time {s.slowest_over_mean_busy or 0:.2f}"] if s.rebalance else [])
      + ([f"window {s.config['window'] / 1e3:,.0f} s: {s.late_ignored:,} late objects ignored; "
          f"{s.results_refilled:,} results refilled after expiries "
          f"({s.refill_ms_mean:.1f} ms per batch expiring and searching"
          + (f", {s.refill_ms_per_result:.3f} ms per refilled result)" if s.refill_ms_per_result else ")")]
         if s.config.get("window") else []))


def _run(a: argparse.Namespace) -> int:
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.prometheus import run_metrics
    from knnmon.coordinator.rebalance.rebalancer import Rebalancer
    from knnmon.coordinator.recovery.reviver import Reviver
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.logs import configure_logging

    configure_logging(a.log_format, logging.WARNING)
    announce_first_compile()
    config = RunConfig(**runtime_settings(a), initial=a.initial, batches=a.batches, shuffle=a.shuffle,
                       store=store_config(a), cost_model=a.cost_model, in_flight=a.in_flight,
                       routing_entries=a.routing_entries, overlap_writes=not a.sync_writes, arrival_ms=a.arrival_ms)
    with Runtime(a.objects, a.queries, config, rebalancer=Rebalancer, reviver=Reviver) as rt:
        summary = rt.run(progress=not a.quiet)
        # Out before the workers, Ray and Redis stop: whatever happens at the stop, the run's
        # summary and report are written.
        print(format_run_summary(summary), flush=True)
        if a.report:
            with open(a.report, "w", encoding="utf-8") as fh:
                json.dump(summary.to_dict(), fh, indent=2)
        if a.metrics_file:
            run_metrics(summary, rt.reports).write(a.metrics_file)
    return 0


def add_run_command(sub: Any) -> None:
    """Register ``run`` on a root parser's subparsers."""
    r = add_verb(sub, "run", "stream objects through the distributed runtime; results go to Redis")
    r.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    r.add_argument("--queries", required=True, metavar="FILE", help="a query file")
    add_worker_options(r)
    r.add_argument("--initial", type=int, default=1_000_000, metavar="N", help="objects seen before the stream")
    add_batch_option(r)
    r.add_argument("--batches", type=int, metavar="M", help="stop after M batches (default: all objects)")
    r.add_argument("--shuffle", type=int, metavar="SEED", help="stream in random order instead of (t, id)")
    add_cost_model_option(r)
    r.add_argument("--in-flight", type=int, default=2, metavar="N",
                   help="batches dispatched before the oldest is waited for (default 2; 1 = one at a time)")
    r.add_argument("--sync-writes", action="store_true",
                   help="each worker waits for a batch's Redis write before its next batch (default: it computes "
                        "the next batch while Redis writes)")
    add_index_option(r, "run")
    add_routing_entries_option(r)
    add_limit_options(r)
    add_window_options(r)
    add_rebalance_options(r)
    r.add_argument("--report", metavar="FILE.json", help="write the summary as JSON")
    r.add_argument("--metrics-file", metavar="FILE.prom",
                   help="write the run's Prometheus metrics at its end, in the text format a scrape returns (for "
                        "benchmarks, or node_exporter's textfile collector)")
    add_log_format_option(r)
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_options(r)
    r.set_defaults(func=_run)
