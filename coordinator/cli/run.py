"""``knnmon run``: stream a data set through the distributed runtime; results go to Redis."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from knnmon.coordinator.cli.options import (add_store_options, add_verb, announce_first_compile, require, setting_flag,
                                            settings_of)

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
    from knnmon.coordinator.runtime.prometheus import run_metrics
    from knnmon.coordinator.rebalance.rebalancer import Rebalancer
    from knnmon.coordinator.recovery.reviver import Reviver
    from knnmon.coordinator.runtime.runtime import Runtime
    from knnmon.logs import configure_logging

    settings = settings_of(a).settings
    r = settings.run
    require(r.objects, "run.objects", "--objects")
    require(r.queries, "run.queries", "--queries")
    configure_logging(settings.log.format, logging.WARNING)
    announce_first_compile()
    with Runtime(r.objects, r.queries, settings.run_config(), rebalancer=Rebalancer, reviver=Reviver) as rt:
        summary = rt.run(progress=settings.log.progress)
        # Out before the workers, Ray and Redis stop: whatever happens at the stop, the run's
        # summary and report are written.
        print(format_run_summary(summary), flush=True)
        if r.report:
            with open(r.report, "w", encoding="utf-8") as fh:
                json.dump(summary.to_dict(), fh, indent=2)
        if r.metrics_file:
            run_metrics(summary, rt.reports).write(r.metrics_file)
    return 0


def add_run_command(sub: Any) -> None:
    """Register ``run`` on a root parser's subparsers: the flags a first day needs; every other
    setting is in ``[run]`` and the shared sections (``knnmon config``)."""
    r = add_verb(sub, "run", "stream objects through the distributed runtime; results go to Redis")
    setting_flag(r, "--objects", "run.objects", metavar="DIR")
    setting_flag(r, "--queries", "run.queries", metavar="FILE")
    setting_flag(r, "--workers", "workers.count", metavar="W")
    setting_flag(r, "--algorithm", "workers.algorithm", metavar="NAME")
    setting_flag(r, "--initial", "run.initial", metavar="N")
    setting_flag(r, "--window", "window.size", metavar="DURATION")
    setting_flag(r, "--report", "run.report", metavar="FILE.json")
    setting_flag(r, "--quiet", "log.progress", switch=False, help="no progress bar")
    add_store_options(r, data_dir=False)
    r.set_defaults(func=_run)
