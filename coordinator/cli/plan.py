"""``knnmon plan``: assign a query file's queries to workers and write the plan
(:mod:`knnmon.coordinator.planning`)."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.coordinator.cli.options import add_config_options, add_verb, require, setting_flag, settings_of
from knnmon.coordinator.planning import explain, make_plan, write_plan

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
    s = settings_of(a).settings
    p, r = s.plan, s.run
    require(r.objects, "run.objects", "--objects")
    require(r.queries, "run.queries", "--queries")
    result = make_plan(r.objects, r.queries, s.workers.count, s.workers.algorithm, initial=r.initial, beta=p.beta,
                       sets_per_worker=p.sets_per_worker, delivery_cost=p.delivery_cost, cost_model=p.cost_model,
                       handout=p.handout, seed=p.seed, processes=p.processes, routing_entries=p.routing_entries)
    write_plan(result, a.out)
    print(format_summary(result.summary))
    if a.explain:
        print()
        print(explain(result, a.explain))
    return 0


def add_plan_command(sub: Any) -> None:
    """Register ``plan`` on a root parser's subparsers; the assignment's parameters are in
    ``[plan]`` (``knnmon config``)."""
    p = add_verb(sub, "plan", "assign queries to workers (load model + assignment algorithm)")
    setting_flag(p, "--objects", "run.objects", metavar="DIR")
    setting_flag(p, "--queries", "run.queries", metavar="FILE")
    setting_flag(p, "--workers", "workers.count", metavar="W")
    setting_flag(p, "--algorithm", "workers.algorithm", metavar="NAME")
    setting_flag(p, "--initial", "run.initial", metavar="N")
    p.add_argument("--out", required=True, metavar="PLANDIR", help="where the plan's files go")
    p.add_argument("--explain", metavar="QID", help="also say how query QID was placed")
    add_config_options(p)
    p.set_defaults(func=_run)
