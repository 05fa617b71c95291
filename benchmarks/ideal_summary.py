"""Summarise ``knnmon bench`` reports with an ``ideal`` row (issue 37): per report and W, each
plan's simulated update time (also without the first batch, whose routing pays the first calls'
set-up) split into the coordinator's routing and the slowest worker's busy time, its
deliveries, the share of the ideal's gain over random it reaches (in ``sim``, and in the
slowest worker's busy time alone: routing is the same code for every plan, and its run-to-run
spread of up to 5 ms per batch is larger than the plans' differences), and how well the
plan's predicted load per worker matched the measured busy time (mean absolute error of each
worker's share, issue 37's target <= 15 %), and how many batches one worker stalled
(:func:`stalls`). Takes ``knnmon bench`` and
``benchmarks/paper_scale.py`` reports.

    python benchmarks/ideal_summary.py /tmp/ideal_100k_shuffled.json /tmp/ideal_100k_time_order.json

``--parts`` instead splits each run's slowest worker per batch (:func:`parts`)::

    python benchmarks/ideal_summary.py --parts /tmp/knnmon-bench/sweep2_1m_k10.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from knnmon.coordinator.bench.ideal import cost_fit


def share_error(predicted, busy) -> float | None:
    """Mean over workers of ``|predicted share - busy share| / busy share``; ``None`` without
    both, or for one worker."""
    if not predicted or not busy or len(predicted) != len(busy) or len(busy) < 2:
        return None
    p, b = np.asarray(predicted, dtype=np.float64), np.asarray(busy, dtype=np.float64)
    if p.sum() <= 0 or (b <= 0).any():
        return None
    return float(np.mean(np.abs(p / p.sum() - b / b.sum()) / (b / b.sum())))


def gain_reached(random: float, plan: float, ideal: float) -> str:
    """The share of the ideal's gain over random that ``plan`` reaches (lower is better, any
    unit), as a percentage; ``-`` when the ideal is not below random."""
    return f"{(random - plan) / (random - ideal):.0%}" if random > ideal else "-"


def slowest_ms(row) -> float:
    """The slowest worker's busy time per batch, averaged over the batches (ms)."""
    return float(np.asarray(row["busy_ms_per_batch"], dtype=np.float64).max(axis=1).mean())


def stalls(busy: np.ndarray, floor_ms: float = 40.0) -> int:
    """Batches (rows of ``busy``, ``(batches, W)`` ms) whose slowest worker took over twice the
    run's median busy time and over ``floor_ms``: a worker's one-off step (a merge of its query
    index), not its share of the stream."""
    return int(((busy.max(axis=1) > 2 * np.median(busy)) & (busy.max(axis=1) > floor_ms)).sum())


def warm_sim(row, busy: np.ndarray) -> float:
    """The simulated update time without the run's first batch (its routing pays the first
    calls' set-up, 1.5-5x the later batches'): mean over the later batches of routing plus the
    slowest worker."""
    route = np.asarray(row["route_cpu_ms_per_batch"], dtype=np.float64)
    sims = route + busy.max(axis=1)
    return float(sims[1:].mean()) if len(sims) > 1 else float(sims.mean())


def table(path: Path) -> str:
    """A markdown table of one report; repeats of a (W, plan) (``knnmon bench --repeat``) are
    averaged, and the table says how many there were."""
    rows = json.loads(path.read_text())["rows"]
    lines = [f"`{path.name}`", "",
             "| W | plan | runs | sim ms | sim ms, batch 2 on | routing ms | slowest busy ms | mean busy ms | "
             "deliveries / object | fixed ms per worker | gain over random reached | slowest worker's gain reached | "
             "predicted vs busy, MAE of shares | stalled batches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in sorted({r["workers"] for r in rows}):
        at: dict[str, list] = {}
        for r in rows:
            if r["workers"] == w:
                at.setdefault(r["algorithm"], []).append(r)
        sim = {name: float(np.mean([r["update_ms_sim_mean"] for r in rs])) for name, rs in at.items()}
        slowest = {name: float(np.mean([slowest_ms(r) for r in rs])) for name, rs in at.items()}
        for name, rs in at.items():
            busy = [np.asarray(r["busy_ms_per_batch"], dtype=np.float64) for r in rs]
            reached = workers_reached = "-"
            if "random" in sim and "ideal" in sim and name not in ("random", "ideal"):
                reached = gain_reached(sim["random"], sim[name], sim["ideal"])
                workers_reached = gain_reached(slowest["random"], slowest[name], slowest["ideal"])
            fixed = [r["fixed_ms"] for r in rs if r.get("fixed_ms") is not None]
            mae = [e for e in (share_error(r.get("predicted_worker_loads"), r.get("busy_ms_per_worker")) for r in rs)
                   if e is not None]
            later = np.mean([warm_sim(r, b) for r, b in zip(rs, busy)])
            lines.append(f"| {w} | {name} | {len(rs)} | {sim[name]:.1f} | {later:.1f} | "
                         f"{np.mean([r['route_cpu_ms_mean'] for r in rs]):.1f} | "
                         f"{slowest[name]:.1f} | "
                         f"{np.mean([b.mean() for b in busy]):.1f} | "
                         f"{np.mean([r['deliveries_per_object'] for r in rs]):.2f} | "
                         f"{f'{np.mean(fixed):.2f}' if fixed else '-'} | {reached} | {workers_reached} | "
                         f"{f'{np.mean(mae):.1%}' if mae else '-'} | "
                         f"{', '.join(f'{stalls(b)}/{len(b)}' for b in busy)} |")
    return "\n".join(lines)


def parts(row: dict, costs: np.ndarray) -> dict[str, float]:
    """One run's slowest busy time per batch (``E[max]``, the mean over batches of the largest
    busy time), split with ``costs`` (:func:`cost_fit` over every run at its ``W``, ideal rows
    left out), in ms per batch. The ideal is one balanced worker with each needed object
    delivered once; the split is:

    - ``mean``: over workers and batches. It is above the ideal by the plan's extra deliveries
      (every candidate and every result change is the same work whatever the plan).
    - ``static``: the largest per-worker mean minus the mean, in fitted busy time (the plan's
      load model missed).
    - ``per_batch``: ``E[max]`` of the fitted busy time minus its largest per-worker mean (one
      batch's objects falling unevenly on the workers' sets).
    - ``noise``: measured ``E[max]`` minus fitted ``E[max]``: busy time no count of work
      explains (the machine's bursts, a worker's one-off steps, CPU contention).
    - ``bursts``: batches in which at least half the workers ran 4 ms or more over their fit.
    - ``redis_corr``: the correlation over batches of the workers' mean residual with the Redis
      server's time on the batch's writes (reports with ``redis_server_ms_per_batch``), or
      ``None``.
    """
    busy = np.asarray(row["busy_ms_per_batch"], dtype=np.float64)  # (batches, W)
    counts = np.asarray(row["per_worker_per_batch"], dtype=np.float64)  # (batches, 3, W)
    fitted = costs[0] + np.einsum("bkw,k->bw", counts, costs[1:])
    over = (busy - fitted) > 4.0
    redis = np.asarray(row.get("redis_server_ms_per_batch") or [], dtype=np.float64)
    batch_residual = (busy - fitted).mean(axis=1)
    corr = float(np.corrcoef(batch_residual, redis)[0, 1]) if len(redis) == len(busy) and redis.std() > 0 else None
    return {"redis_corr": corr, "e_max": float(busy.max(axis=1).mean()), "mean": float(busy.mean()),
            "static": float(fitted.mean(axis=0).max() - fitted.mean()),
            "per_batch": float(fitted.max(axis=1).mean() - fitted.mean(axis=0).max()),
            "noise": float(busy.max(axis=1).mean() - fitted.max(axis=1).mean()),
            "bursts": int((over.sum(axis=1) >= busy.shape[1] / 2).sum()), "batches": len(busy)}


def parts_table(path: Path) -> str:
    """:func:`parts` as a markdown table of one report, a line per run."""
    rows = [r for r in json.loads(path.read_text())["rows"] if r.get("per_worker_per_batch") and r["workers"] > 1]
    lines = [f"`{path.name}`", "",
             "| W | plan | E[max] busy ms | mean busy ms | static imbalance ms | per-batch imbalance ms | noise ms | "
             "bursts | Redis | fitted costs (fixed ms, us per object, candidate, change) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w in sorted({r["workers"] for r in rows}):
        at = [r for r in rows if r["workers"] == w]
        costs = cost_fit([r for r in at if r["algorithm"] != "ideal"])
        if costs is None:
            continue
        shown = f"{costs[0]:.2f}, " + ", ".join(f"{c * 1e3:.1f}" for c in costs[1:])
        for r in at:
            if r["algorithm"] == "ideal":
                busy = r["update_ms_sim_mean"] - r["route_cpu_ms_mean"]
                lines.append(f"| {w} | ideal | {busy:.1f} | - | - | - | - | - | - | - |")
                continue
            p = parts(r, costs)
            lines.append(f"| {w} | {r['algorithm']} | {p['e_max']:.1f} | {p['mean']:.1f} | {p['static']:.1f} | "
                         f"{p['per_batch']:.1f} | {p['noise']:.1f} | {p['bursts']}/{p['batches']} | "
                         f"{'-' if p['redis_corr'] is None else format(p['redis_corr'], '.2f')} | {shown} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="bench reports (JSON) with an ideal row")
    p.add_argument("--parts", action="store_true", help="split each run's slowest worker per batch instead")
    a = p.parse_args()
    print("\n\n".join((parts_table if a.parts else table)(Path(x)) for x in a.reports))


if __name__ == "__main__":
    main()
