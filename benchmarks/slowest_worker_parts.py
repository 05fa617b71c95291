"""Where each plan's slowest worker per batch loses to the ideal (issue 37): its busy time split by
the cost model fitted over every run at the same ``W``.

The ideal is one balanced worker with each needed object delivered once. A plan's slowest busy
time per batch (``E[max]``, the mean over batches of the largest busy time) is split into:

- **mean busy**: the mean over workers and batches. It is above the ideal by the plan's extra
  deliveries (every candidate and every result change is the same work whatever the plan).
- **static imbalance**: the largest per-worker mean minus the mean, in fitted busy time (the
  plan's load model missed).
- **per-batch imbalance**: ``E[max]`` of the fitted busy time minus its largest per-worker mean.
  One batch's objects fall unevenly on the workers' sets.
- **noise**: measured ``E[max]`` minus fitted ``E[max]``. This is busy time that no count of work
  explains: the machine's bursts, a worker's one-off steps, CPU contention.
  "Bursts" counts the batches in which at least half the workers ran 4 ms or more over their fit;
  "Redis" is the correlation over batches of the workers' mean residual with the Redis server's
  time on the batch's writes (reports with ``redis_server_ms_per_batch``).

The costs are :func:`knnmon.coordinator.bench.ideal.cost_fit` over all rows at that ``W``, except
ideal rows. Takes ``knnmon bench`` and ``benchmarks/paper_scale.py`` reports::

    python benchmarks/slowest_worker_parts.py docs/bench/sweep2_1m_k10.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from knnmon.coordinator.bench.ideal import cost_fit


def parts(row: dict, costs: np.ndarray) -> dict[str, float]:
    """One run's split (module docstring), ms per batch; ``bursts`` is a count of batches."""
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


def table(path: Path) -> str:
    """A markdown table of one report, a line per run."""
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
                lines.append(f"| {w} | ideal | {r['update_ms_sim_mean'] - r['route_cpu_ms_mean']:.1f} | - | - | - | - | - "
                             f"| - | - |")
                continue
            p = parts(r, costs)
            lines.append(f"| {w} | {r['algorithm']} | {p['e_max']:.1f} | {p['mean']:.1f} | {p['static']:.1f} | "
                         f"{p['per_batch']:.1f} | {p['noise']:.1f} | {p['bursts']}/{p['batches']} | "
                         f"{'-' if p['redis_corr'] is None else format(p['redis_corr'], '.2f')} | {shown} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="bench or paper_scale reports (JSON)")
    a = p.parse_args()
    print("\n\n".join(table(Path(x)) for x in a.reports))


if __name__ == "__main__":
    main()
