"""The ``knnmon`` command line: one entry point, one module per verb.

``ingest``, ``queries``, ``plan``, ``run``, ``results``, ``explain``, ``bench``, ``serve``, ``status``,
``repair``, ``dashboard``, ``demo`` and ``config`` each live in a module of this package; each
flag sets a setting of :mod:`~knnmon.coordinator.cli.settings`
(:mod:`~knnmon.coordinator.cli.options`). A verb's module imports its heavy parts (Spark, Ray,
the runtime) when it runs, so ``knnmon --help`` stays fast.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from knnmon import __version__
from knnmon import termination
from knnmon.errors import KnnmonError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    from knnmon.coordinator.cli import (bench, config, dashboard, demo, explain, ingest, plan, queries, repair, results,
                                        run, serve, status)

    parser = argparse.ArgumentParser(
        prog="knnmon",
        description="Exact, distributed kNN monitoring of spatial-keyword queries over geo-tagged streams.",
    )
    parser.add_argument("--version", action="version", version=f"knnmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_demo_command(sub)
    ingest.add_ingest_commands(sub)
    queries.add_queries_commands(sub)
    plan.add_plan_command(sub)
    run.add_run_command(sub)
    results.add_results_command(sub)
    explain.add_explain_command(sub)
    bench.add_bench_command(sub)
    serve.add_serve_command(sub)
    status.add_status_command(sub)
    repair.add_repair_command(sub)
    dashboard.add_dashboard_command(sub)
    config.add_config_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``knnmon``; returns the exit status (0 ok, 2 bad input or usage). SIGTERM (what
    systemd and Kubernetes send) unwinds a command as Ctrl-C does, so that what it started (an
    embedded Redis) stops: the exit status is then 143 (``knnmon serve`` handles it itself: it
    finishes its batch and exits 0)."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, termination.on_sigterm)
    try:
        return int(args.func(args) or 0)
    except KnnmonError as ex:
        print(f"knnmon {args.command}: error: {ex}", file=sys.stderr)
        return 2
