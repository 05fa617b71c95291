"""Summarise ``knnmon bench`` reports with an ``ideal`` row (issue 37): per report and W, each
plan's simulated update time split into the coordinator's routing and the slowest worker's busy
time, its deliveries, the share of the ideal's gain over random it reaches, and how well the
plan's predicted load per worker matched the measured busy time (mean absolute error of each
worker's share, issue 37's target <= 15 %). Takes ``knnmon bench`` and
``benchmarks/paper_scale.py`` reports.

    python benchmarks/ideal_summary.py docs/bench/ideal_100k_shuffled.json docs/bench/ideal_100k_time_order.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def share_error(predicted, busy) -> float | None:
    """Mean over workers of ``|predicted share - busy share| / busy share``; ``None`` without
    both, or for one worker."""
    if not predicted or not busy or len(predicted) != len(busy) or len(busy) < 2:
        return None
    p, b = np.asarray(predicted, dtype=np.float64), np.asarray(busy, dtype=np.float64)
    if p.sum() <= 0 or (b <= 0).any():
        return None
    return float(np.mean(np.abs(p / p.sum() - b / b.sum()) / (b / b.sum())))


def table(path: Path) -> str:
    """A markdown table of one report."""
    rows = json.loads(path.read_text())["rows"]
    lines = [f"`{path.name}`", "",
             "| W | plan | sim ms | routing ms | slowest busy ms | mean busy ms | deliveries / object | "
             "fixed ms per worker | gain over random reached | predicted vs busy, MAE of shares |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w in sorted({r["workers"] for r in rows}):
        at = {r["algorithm"]: r for r in rows if r["workers"] == w}
        random, ideal = at.get("random"), at.get("ideal")
        for name, r in at.items():
            busy = np.asarray(r["busy_ms_per_batch"], dtype=np.float64)
            reached = "-"
            if random and ideal and name not in ("random", "ideal"):
                full = random["update_ms_sim_mean"] - ideal["update_ms_sim_mean"]
                reached = f"{(random['update_ms_sim_mean'] - r['update_ms_sim_mean']) / full:.0%}" if full > 0 else "-"
            fixed = f"{r['fixed_ms']:.2f}" if r.get("fixed_ms") is not None else "-"
            mae = share_error(r.get("predicted_worker_loads"), r.get("busy_ms_per_worker"))
            lines.append(f"| {w} | {name} | {r['update_ms_sim_mean']:.1f} | {r['route_cpu_ms_mean']:.1f} | "
                         f"{busy.max(axis=1).mean():.1f} | {busy.mean():.1f} | {r['deliveries_per_object']:.2f} | "
                         f"{fixed} | {reached} | {'-' if mae is None else f'{mae:.1%}'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="bench reports (JSON) with an ideal row")
    a = p.parse_args()
    print("\n\n".join(table(Path(x)) for x in a.reports))


if __name__ == "__main__":
    main()
