"""Plot per-worker busy time over the stream, static plan against re-balanced, from a
``knnmon bench --rebalance off,on`` report (its rows' ``busy_ms_per_batch``).

    python benchmarks/rebalance_plot.py /tmp/rebalance_time_order.json --out /tmp/rebalance_busy.png
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", help="a knnmon bench JSON report with --rebalance off,on rows")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--algorithm", default="proposed")
    p.add_argument("--smooth", type=int, default=10, help="batches per moving average (default 10)")
    a = p.parse_args()
    rows = [r for r in json.load(open(a.report))["rows"] if r["algorithm"] == a.algorithm and r.get("busy_ms_per_batch")]
    ws = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(len(ws), 2, figsize=(12, 3.2 * len(ws)), sharex=True, squeeze=False)
    for i, w in enumerate(ws):
        for j, on in enumerate((False, True)):
            ax = axes[i][j]
            row = next((r for r in rows if r["workers"] == w and bool(r["rebalance"]) == on), None)
            if row is None:
                ax.set_visible(False)
                continue
            busy = np.asarray(row["busy_ms_per_batch"], dtype=float)  # (batches, W)
            kernel = np.ones(a.smooth) / a.smooth
            for k in range(busy.shape[1]):
                ax.plot(np.convolve(busy[:, k], kernel, mode="valid"), lw=0.8)
            for rec in row.get("replan_records") or []:
                ax.axvline(rec["batch"], color="k", lw=0.4, alpha=0.4)
            ratio = row["slowest_over_mean_busy"]
            ax.set_title(f"W={w}, {'re-balanced' if on else 'static plan'}: slowest/mean busy {ratio:.2f}, "
                         f"sim update {row['update_ms_sim_mean']:.0f} ms" + (f", {row['queries_moved']:,} moved"
                                                                              if on else ""), fontsize=9)
            ax.set_ylabel("busy ms per batch")
    for ax in axes[-1]:
        ax.set_xlabel("batch (moving average; vertical lines: re-plans)")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
