"""Plots of a ``knnmon bench`` report in the shape of the paper's Figs. 9-11 (matplotlib, PNG).

One figure per swept parameter (workers, ``k_max``, queries) with two panels: simulated parallel
update time and load imbalance (ms, log scale), one line per algorithm. The single-process
reference, which has no workers, is a dashed line in the update-time panel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd

__all__ = ["SWEEPS", "plot_report"]

#: Report column -> axis label, for the parameters a bench can sweep.
SWEEPS = {"workers": "workers", "kmax": "k_max", "queries": "queries"}


def plot_report(rows: Sequence[dict[str, Any]], out_dir: str, *, prefix: str = "",
                base: dict[str, Any] | None = None) -> list[str]:
    """Write ``{prefix}update_vs_{param}.png`` for each parameter with 2+ values; returns the paths.

    When several parameters vary, each figure holds the others at ``base`` (parameter -> value,
    e.g. the paper's ``{"workers": 12, "kmax": 10, "queries": 1_000_000}``), or, for a parameter
    ``base`` does not name, at its smallest value.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame([r for r in rows if not r.get("interrupted")])
    if df.empty:
        return []
    os.makedirs(out_dir, exist_ok=True)
    ref = df[df.algorithm == "single"]
    runs = df[df.algorithm != "single"]
    paths = []
    for param, label in SWEEPS.items():
        if runs.empty or runs[param].nunique() < 2:
            continue
        fixed = {p: (base or {}).get(p, runs[p].min()) for p in SWEEPS if p != param}
        sel = runs[(runs[list(fixed)] == pd.Series(fixed)).all(axis=1)]
        fig, (ax_u, ax_i) = plt.subplots(1, 2, figsize=(10, 4))
        for algorithm, g in sel.groupby("algorithm"):
            m = g.groupby(param)[["update_ms_sim_mean", "imbalance_ms_mean"]].mean().sort_index()
            ax_u.plot(m.index, m.update_ms_sim_mean, marker="o", label=algorithm)
            ax_i.plot(m.index, m.imbalance_ms_mean, marker="o", label=algorithm)
        r = ref[(ref[[p for p in fixed if p != "workers"]] == pd.Series(
            {p: v for p, v in fixed.items() if p != "workers"})).all(axis=1)] if param != "workers" else ref
        if not r.empty:
            m = r.groupby(param)["update_ms_sim_mean"].mean().sort_index()
            if param == "workers":
                ax_u.axhline(m.mean(), linestyle="--", color="gray", label="single process")
            else:
                ax_u.plot(m.index, m.values, linestyle="--", color="gray", marker="x", label="single process")
        for ax, title in ((ax_u, "update time (simulated parallel) [ms]"), (ax_i, "load imbalance [ms]")):
            ax.set_xlabel(label)
            ax.set_ylabel(title)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        ax_u.legend(fontsize=8)
        held = ", ".join(f"{SWEEPS[p]}={v:,}" for p, v in fixed.items())
        fig.suptitle(f"update time and load imbalance vs {label} ({held})")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{prefix}update_vs_{param}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
