"""The ``knnmon`` command line: one entry point, one subcommand per capability."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from knnmon import __version__
from knnmon.coordinator.bench import add_bench_command
from knnmon.coordinator.demo import add_demo_command
from knnmon.coordinator.plan import add_plan_command
from knnmon.coordinator.run import add_run_commands
from knnmon.coordinator.serve_cli import add_serve_commands
from knnmon.errors import KnnmonError
from knnmon.ingest.cli import add_ingest_commands, add_queries_commands

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="knnmon",
        description="Exact, distributed kNN monitoring of spatial-keyword queries over geo-tagged streams.",
    )
    parser.add_argument("--version", action="version", version=f"knnmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_command(sub)
    add_ingest_commands(sub)
    add_queries_commands(sub)
    add_plan_command(sub)
    add_run_commands(sub)
    add_bench_command(sub)
    add_serve_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``knnmon``; returns the exit status (0 ok, 2 bad input or usage)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KnnmonError as ex:
        print(f"knnmon {args.command}: error: {ex}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
