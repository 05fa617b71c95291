"""The paper's Figs. 9-11 from ``benchmarks/paper_scale.py`` reports (issue 37, item 3): simulated
parallel update time and load imbalance against workers, ``k_max`` and queries, one line per
plan (proposed, random, ideal), drawn by :func:`knnmon.coordinator.bench.plots.plot_report`.

    python benchmarks/sweep_plots.py /tmp/knnmon-bench/sweep_*.json --out /tmp/knnmon-bench/plots --prefix scale_

Load imbalance is the paper's: per batch, the slowest worker's busy time minus the fastest's,
averaged over the batches (0 for the ideal, which is balanced by construction). Rows that did not
finish (no ``update_ms_sim_mean``) are left out and listed. Also prints the sweep's table, one
row per (queries, W, k_max), for /tmp/knnmon-benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from knnmon.coordinator.bench.plots import plot_report

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (ideal_summary, beside this script)


def plot_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows :func:`plot_report` takes (``workers``, ``kmax``, ``queries``, ``algorithm``,
    ``update_ms_sim_mean``, ``imbalance_ms_mean``) from paper_scale reports' rows."""
    out = []
    for report in reports:
        kmax = {r["n"]: r["kmax"] for r in report["rows"] if r.get("kmax")}
        for r in report["rows"]:
            if r["algorithm"] == "ideal-one-worker":
                continue
            if r.get("update_ms_sim_mean") is None:
                print(f"left out (unfinished): n={r['n']:,} W={r['workers']} {r['algorithm']}", file=sys.stderr)
                continue
            busy = np.asarray(r.get("busy_ms_per_batch") or [[0.0]], dtype=np.float64)
            out.append({"workers": r["workers"], "kmax": r.get("kmax", kmax.get(r["n"])), "queries": r["n"],
                        "algorithm": r["algorithm"], "update_ms_sim_mean": r["update_ms_sim_mean"],
                        "imbalance_ms_mean": float((busy.max(axis=1) - busy.min(axis=1)).mean())})
    return out


def sweep_table(reports: list[dict[str, Any]]) -> str:
    """Markdown rows, one per (queries, W, k_max): proposed, random and ideal ``sim``; the
    ratios in ``sim``, in the median batch's ``sim`` (a worker's occasional 100-190 ms batch,
    seen at 3 M in every plan, moves a 20-batch mean by several ms) and in the slowest worker's
    busy time; deliveries per object; the share of the ideal's gain reached (in ``sim`` / in
    the slowest worker); proposed's MAE of shares."""
    from ideal_summary import gain_reached, share_error, slowest_ms

    groups: dict[tuple, dict[str, dict]] = {}
    for report in reports:
        kmax = {r["n"]: r["kmax"] for r in report["rows"] if r.get("kmax")}
        for r in report["rows"]:
            if r.get("update_ms_sim_mean") is not None:
                groups.setdefault((r["n"], r["workers"], kmax.get(r["n"])), {})[r["algorithm"]] = r
    lines = []
    for (n, w, k), at in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][2] or 0)):
        p, rnd, ideal = at.get("proposed"), at.get("random"), at.get("ideal")
        if not (p and rnd and ideal):
            continue
        slow = {name: slowest_ms(r) for name, r in (("p", p), ("r", rnd), ("i", ideal))}
        sim = {"p": p["update_ms_sim_mean"], "r": rnd["update_ms_sim_mean"], "i": ideal["update_ms_sim_mean"]}
        med = {name: float(np.median(np.asarray(r["route_cpu_ms_per_batch"], dtype=np.float64)
                                     + np.asarray(r["busy_ms_per_batch"], dtype=np.float64).max(axis=1)))
               for name, r in (("p", p), ("r", rnd))}

        mae = share_error(p.get("predicted_worker_loads"), p.get("busy_ms_per_worker"))
        lines.append(f"| {n:,} | {w} | {k} | {sim['p']:.1f} | {sim['r']:.1f} | {sim['i']:.1f} | "
                     f"{sim['p'] / sim['r']:.2f} | {med['p'] / med['r']:.2f} | {slow['p'] / slow['r']:.2f} | "
                     f"{p['deliveries_per_object']:.2f} / {rnd['deliveries_per_object']:.2f} | "
                     f"{gain_reached(sim['r'], sim['p'], sim['i'])} / "
                     f"{gain_reached(slow['r'], slow['p'], slow['i'])} | {'-' if mae is None else f'{mae:.1%}'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="paper_scale.py reports (JSON)")
    p.add_argument("--out", default="/tmp/knnmon-bench/plots", help="directory of the PNGs")
    p.add_argument("--prefix", default="scale_")
    p.add_argument("--base", default="workers=12,kmax=10,queries=1000000",
                   help="the values held while another parameter varies")
    a = p.parse_args()
    base = {k: int(v) for k, v in (item.split("=") for item in a.base.split(","))}
    reports = [json.load(open(path, encoding="utf-8")) for path in a.reports]
    for path in plot_report(plot_rows(reports), a.out, prefix=a.prefix, base=base):
        print(path)
    print(sweep_table(reports))


if __name__ == "__main__":
    main()
