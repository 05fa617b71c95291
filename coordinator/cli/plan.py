"""``knnmon plan``: assign a query file's queries to workers and write the plan
(:mod:`knnmon.coordinator.planning`)."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.coordinator.cli.options import add_verb, add_cost_model_option, add_routing_entries_option
from knnmon.coordinator.planning import DEFAULT_INITIAL, explain, make_plan, write_plan

__all__ = ["add_plan_command", "format_summary"]


def format_summary(s: dict[str, Any]) -> str:
    """A readable table of a plan summary."""
    head = f"{'worker':>6} {'queries':>9} {'work L(w)':>12} {'deliv D(w)':>11} {'load':>12}"
    rows = [head, "-" * len(head)]
    for w in range(s["workers"]):
        rows.append(f"{w:>6} {s['worker_queries'][w]:>9,} {s['worker_work'][w]:>12.4f} "
                    f"{s['worker_deliveries'][w]:>11.4f} {s['worker_loads'][w]:>12.4f}")
    rows.append(f"algorithm {s['algorithm']}: {s['queries']:,} queries in {s['sets']} sets on {s['workers']} workers; "
                f"imbalance (max/mean) {s['imbalance']:.3f}; deliveries per object {s['deliveries_per_object']:.2f}; "
                f"{s['elapsed_s']:.1f} s")
    notes = [(s["queries_outside_stats_bbox"], "queries lie outside the statistics' bounding box (clamped to edge cells)"),
             (s["queries_with_keywords_absent_from_stats"], "queries have keywords absent from the statistics (load 0 for those, still routed)"),
             (s["radius_inf_queries"], "queries have fewer than k matching initial objects (r_q = inf)"),
             (s.get("routing_pairs_promoted", 0),
              f"(worker, keyword) pairs of {s.get('routing_pairs', 0):,} are routed everywhere to keep the routing "
              f"table within {s.get('routing_max_entries', 0):,} entries (+{s.get('routing_promoted_extra_deliveries', 0):.4f} "
              "expected deliveries per object)")]
    rows += [f"note: {n:,} {text}" for n, text in notes if n]
    return "\n".join(rows)


def _run(a: argparse.Namespace) -> int:
    result = make_plan(a.objects, a.queries, a.workers, a.algorithm, initial=a.initial, beta=a.beta,
                       sets_per_worker=a.sets_per_worker, delivery_cost=a.delivery_cost, cost_model=a.cost_model,
                       handout=a.handout, seed=a.seed, processes=a.processes,
                       routing_entries=a.routing_entries)
    write_plan(result, a.out)
    print(format_summary(result.summary))
    if a.explain:
        print()
        print(explain(result, a.explain))
    return 0


def add_plan_command(sub: Any) -> None:
    """Register ``plan`` on a root parser's subparsers."""
    p = add_verb(sub, "plan", "assign queries to workers (load model + assignment algorithm)")
    p.add_argument("--objects", required=True, metavar="DIR", help="an ingest output directory")
    p.add_argument("--queries", required=True, metavar="FILE", help="a query file (knnmon queries generate)")
    p.add_argument("--workers", type=int, required=True, metavar="W", help="number of workers to plan for")
    p.add_argument("--algorithm", required=True, choices=sorted(ALGORITHMS),
                   help="the paper's proposed partitioning, or a baseline")
    p.add_argument("--initial", type=int, default=DEFAULT_INITIAL, metavar="N",
                   help=f"objects seen before the stream; r_q is exact over them (default {DEFAULT_INITIAL:,})")
    p.add_argument("--beta", type=int, default=100_000, help="sets above BETA queries split by space (default 100,000)")
    p.add_argument("--sets-per-worker", type=int, default=8, help="proposed: stop at this many sets per worker (default 8)")
    add_cost_model_option(p)
    p.add_argument("--delivery-cost", type=float, default=None,
                   help="weight of one delivery (lambda; default: 10.9 us under the measured model, 1 under the "
                        "paper's)")
    p.add_argument("--handout", choices=("set", "query"), default="set",
                   help="proposed: assign whole sets (default) or query by query as the paper prints it")
    p.add_argument("--seed", type=int, default=0, help="random assignment and delivery sample seed")
    add_routing_entries_option(p)
    p.add_argument("--processes", type=int, default=2, help="processes for the kNN radii (default 2)")
    p.add_argument("--out", required=True, metavar="PLANDIR", help="where the plan's files go")
    p.add_argument("--explain", metavar="QID", help="also say how query QID was placed")
    p.set_defaults(func=_run)
