"""Summarise a re-balancing sitting (``benchmarks/rebalance_sitting.sh``): one table row per
stream, W and setting (the mean of its runs, and each run), and the calibration plot of every
moving re-plan's predicted gain against its realised gain (issue 36, item 3).

    python benchmarks/rebalance_summary.py /tmp/sitting36 --plot /tmp/rebalance_calibration.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def runs(folder: Path) -> list[dict]:
    """Every run of the sitting: ``stream``, ``workers``, ``setting`` and its bench row."""
    out = []
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        stream = "drift" if path.name.startswith("drift") else path.name.rsplit("_w", 1)[0]
        trigger = d.get("config", {}).get("rebalance_config", {}).get("trigger")
        for row in d["rows"]:
            setting = row.get("setting") or (trigger if row["rebalance"] else "off")
            out.append({"stream": stream, "workers": row["workers"], "setting": setting, "row": row,
                        "file": path.name})
    return out


def slowest_per_batch(row: dict) -> float:
    """The slowest worker's busy time per batch, mean over the run (ms)."""
    busy = np.asarray(row["busy_ms_per_batch"], dtype=np.float64)
    return float(busy.max(axis=1).mean()) if busy.size else float("nan")


def stall_ms(record: dict) -> float:
    """A re-plan's stall (ms): the dispatch's wait at its move's boundary, and with a hand-over
    in flight at its landing's too (``land_seconds``)."""
    return 1e3 * (record["seconds"] + record.get("land_seconds", 0.0))


def table(all_runs: list[dict]) -> str:
    """A markdown table: per stream, W and setting, each run's figures (``a / b``)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in all_runs:
        groups[(r["stream"], r["workers"], r["setting"])].append(r["row"])
    order = {"off": 0, "window": 1, "smoothed": 2, "predictive": 3}
    lines = ["| stream | W | setting | objects/s | x off | sim ms | slowest busy ms/batch | slowest / mean | "
             "re-plans | moved | deliveries / object | stall ms (max) | exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (stream, w, setting), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
        off = np.mean([r["objects_per_s"] for r in groups.get((stream, w, "off"), [])] or [np.nan])

        def each(f, fmt="{:.1f}"):
            return " / ".join(fmt.format(f(r)) for r in rows)
        stalls = [stall_ms(x) for r in rows for x in r.get("replan_records", []) if x.get("queries_moved")]
        lines.append(
            f"| {stream} | {w} | {setting} | {each(lambda r: r['objects_per_s'], '{:,.0f}')} | "
            f"{np.mean([r['objects_per_s'] for r in rows]) / off:.2f} | {each(lambda r: r['update_ms_sim_mean'])} | "
            f"{each(slowest_per_batch)} | {each(lambda r: r['slowest_over_mean_busy'], '{:.2f}')} | "
            f"{each(lambda r: r['replans'], '{:d}')} | {each(lambda r: r['queries_moved'], '{:,d}')} | "
            f"{each(lambda r: r['deliveries_per_object'], '{:.2f}')} | "
            f"{f'{max(stalls):.0f}' if stalls else '-'} | {_exact(rows)} |")
    return "\n".join(lines)


def _exact(rows: list[dict]) -> str:
    """``yes`` when every run's sampled oracle agreed, ``NO`` when one did not, ``-`` unchecked."""
    checked = [r.get("exact") for r in rows if r.get("exact") is not None]
    return "-" if not checked else ("yes" if all(checked) else "NO")


def balance_bound(all_runs: list[dict], cores: int) -> str:
    """What perfect balance could save per batch without re-balancing (the ``off`` runs): on
    ``cores`` cores the workers' part of a batch takes at least their summed busy time over the
    cores, and at least the slowest worker's; balance brings ``max(slowest, sum / cores)`` down to
    ``sum / cores`` at best. Lines of ``stream, W, wall ms, that part now, at best, and the best
    throughput ratio if the rest of a batch stays``."""
    lines = []
    for r in all_runs:
        if r["setting"] != "off":
            continue
        busy = np.asarray(r["row"]["busy_ms_per_batch"], dtype=np.float64)
        now = np.maximum(busy.max(axis=1), busy.sum(axis=1) / cores).mean()
        best = (busy.sum(axis=1) / cores).mean()
        wall = r["row"]["update_ms_wall_mean"]
        lines.append(f"bound {r['stream']} W={r['workers']} ({r['file']}): wall {wall:.1f} ms, workers' part now "
                     f"{now:.1f} ms, balanced {best:.1f} ms: at most {wall / (wall - now + best):.2f}x the throughput")
    return "\n".join(lines)


def calibration(all_runs: list[dict], path: str) -> list[tuple]:
    """Scatter every judged moving re-plan's predicted against realised gain; returns the points
    ``(stream, W, setting, predicted, realised)``."""
    points = [(r["stream"], r["workers"], r["setting"], x["predicted_gain"], x["realized_gain"])
              for r in all_runs for x in r["row"].get("replan_records", [])
              if x.get("queries_moved") and "realized_gain" in x]
    fig, ax = plt.subplots(figsize=(6, 5.5))
    marks = {"drift": "o", "time_order": "s", "shuffled": "^"}
    colors = {"window": "tab:gray", "smoothed": "tab:blue", "predictive": "tab:orange"}
    for stream, setting in sorted({(p[0], p[2]) for p in points}):
        sel = [p for p in points if p[0] == stream and p[2] == setting]
        ax.scatter([p[3] for p in sel], [p[4] for p in sel], marker=marks.get(stream, "x"),
                   color=colors.get(setting, "k"), label=f"{stream}, {setting} ({len(sel)})", alpha=0.8)
    top = max([0.6] + [max(p[3], p[4]) for p in points])
    ax.plot([0, top], [0, top], "k--", lw=0.8, label="realised = predicted")
    below = sum(p[4] < -1 for p in points)
    ax.set_ylim(-1.05, top + 0.05)
    if below:
        ax.text(0.02, -1.0, f"{below} below -1 not shown (the slowest worker slower after the move)", fontsize=7)
    ax.set_xlabel("predicted gain (slowest worker's busy time, share)")
    ax.set_ylabel("realised gain over the next batches (share)")
    ax.set_title("Re-plans: predicted against realised gain")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return points


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the sitting's JSON reports")
    p.add_argument("--plot", help="the calibration PNG to write")
    p.add_argument("--cores", type=int, default=2, help="cores of the machine, for the balance bound (default 2)")
    a = p.parse_args()
    all_runs = runs(Path(a.folder))
    print(table(all_runs))
    print(balance_bound(all_runs, a.cores))
    if a.plot:
        points = calibration(all_runs, a.plot)
        for pt in points:
            print("calibration", *pt)


if __name__ == "__main__":
    main()
