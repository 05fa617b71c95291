"""The paper's three experiments (Tsuruoka et al. 2019, §5, Table 2) with
``knnmon bench`` on the real places, plus markdown tables of the results.

    python benchmarks/paper_experiments.py --objects /tmp/full_default --out /tmp/bench

Experiments (all 1,000,000 initial objects, then batches of 1,000):

- ``workers``: W = 4, 8, 12, 16, 20, 24; 100,000 queries; k_max = 10; plus the single-process
  reference; objects streamed in random order (stationary, as the load model assumes);
- ``workers_time_order``: the same in the data's (t, id) order, which is not stationary;
- ``kmax``: k_max = 5, 10, 15, 20; W = 12; 100,000 queries; random order;
- ``queries``: 100,000, 300,000, 1,000,000 queries; W = 12; k_max = 10; random order (30 batches: the
  1 M-query runs spend most of their time loading initial results into Redis);
- ``repeats``: W = 12, 100,000 queries, k_max = 10, random order, every algorithm three times
  (run-to-run spread);
- ``check``: the proposed plan at W = 12 with 100,000 queries; 2,000 of them (seeded sample)
  checked against the brute-force oracle over the 1,060,000 objects seen;
- ``synthetic``: W = 4-24 on the **synthetic** Twitter-shaped stream given by ``--synthetic DIR``
  (``knnmon ingest synthetic --n 1060000 --seed 0 --out DIR``), in its own order;
- ``synthetic_kmax`` and ``synthetic_queries``: the ``kmax`` and ``queries`` experiments on that
  stream; ``synthetic_check``: 300,000 synthetic queries (a routing table that had to be bounded),
  2,000 checked against the oracle.

Every row records the speed probe before and after its run (``coordinator/bench/speed_probe.py``);
rows whose probes differ much from the rest of their experiment were measured while this
shared machine ran slower.
"""

from __future__ import annotations

import argparse
import json
import os

from knnmon.coordinator.bench.runner import BenchConfig, run_bench
from knnmon.coordinator.bench.plots import plot_report

ALGS = ("proposed", "keyword", "space", "random")
EXPERIMENTS = {
    "workers": {"queries": (100_000,), "kmax": (10,), "workers": (4, 8, 12, 16, 20, 24),
                "algorithms": (*ALGS, "single"), "shuffle": 1},
    "workers_time_order": {"queries": (100_000,), "kmax": (10,), "workers": (4, 8, 12, 16, 20, 24),
                           "algorithms": ALGS},
    "kmax": {"queries": (100_000,), "kmax": (5, 10, 15, 20), "workers": (12,), "algorithms": ALGS, "shuffle": 1},
    "queries": {"queries": (100_000, 300_000, 1_000_000), "kmax": (10,), "workers": (12,), "algorithms": ALGS,
                "batches": 30, "shuffle": 1},
    "repeats": {"queries": (100_000,), "kmax": (10,), "workers": (12,), "algorithms": ALGS, "shuffle": 1, "repeat": 3},
    # The brute-force oracle takes ~10 ms per query over 1 M objects: a seeded sample of 2,000 queries.
    "check": {"queries": (100_000,), "kmax": (10,), "workers": (12,), "algorithms": ("proposed",), "shuffle": 1,
              "check": True, "check_sample": 2000},
    # On --synthetic DIR (knnmon ingest synthetic --n 1060000 --seed 0): Twitter-shaped, SYNTHETIC.
    "synthetic": {"queries": (100_000,), "kmax": (10,), "workers": (4, 8, 12, 16, 20, 24), "algorithms": ALGS,
                  "synthetic": True},
    "synthetic_kmax": {"queries": (100_000,), "kmax": (5, 10, 15, 20), "workers": (12,), "algorithms": ALGS,
                       "synthetic": True},
    "synthetic_queries": {"queries": (100_000, 300_000, 1_000_000), "kmax": (10,), "workers": (12,),
                          "algorithms": ALGS, "batches": 30, "synthetic": True},
    # Exactness where the routing table is bounded (pairs sent everywhere): 300 k synthetic queries.
    "synthetic_check": {"queries": (300_000,), "kmax": (10,), "workers": (12,), "algorithms": ("proposed",),
                        "batches": 30, "synthetic": True, "check": True, "check_sample": 2000},
}
COLUMNS = [("algorithm", "algorithm", "{}"), ("workers", "W", "{}"), ("kmax", "k_max", "{}"),
           ("queries", "queries", "{:,}"), ("update_ms_sim_mean", "sim update ms", "{:.1f}"),
           ("update_ms_sim_p99", "sim p99 ms", "{:.1f}"), ("update_ms_wall_mean", "wall ms", "{:.1f}"),
           ("imbalance_ms_mean", "imbalance ms", "{:.1f}"), ("slowest_over_mean_busy", "slowest / mean", "{:.2f}"),
           ("objects_per_s", "objects/s", "{:,.0f}"), ("deliveries_per_object", "deliveries/object", "{:.2f}"),
           ("spearman_predicted_vs_busy", "Spearman", "{:.2f}"),
           ("speed_probe_ms", "probe ms before / after", "{0[0]:.0f} / {0[1]:.0f}")]


def table(rows: list[dict]) -> str:
    """A markdown table of report rows."""
    out = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        out.append("| " + " | ".join("-" if r.get(k) is None else f.format(r[k]) for k, _, f in COLUMNS) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--synthetic", metavar="DIR", help="a synthetic ingest output (for the synthetic experiment)")
    p.add_argument("--out", required=True)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--only", choices=sorted(EXPERIMENTS), action="append")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.only or [e for e in EXPERIMENTS if a.synthetic or not EXPERIMENTS[e].get("synthetic")]:
        spec = dict(EXPERIMENTS[name])
        batches = spec.pop("batches", a.batches)
        objects = a.synthetic if spec.pop("synthetic", False) else a.objects
        if objects is None:
            p.error(f"the {name} experiment needs --synthetic DIR")
        report = os.path.join(a.out, f"{name}.json")
        out = run_bench(BenchConfig(objects=objects, batches=batches, **spec), report, progress=False)
        plot_report(out["rows"], a.out, prefix=f"{name}_")
        with open(os.path.join(a.out, f"{name}.md"), "w") as f:
            f.write(table(out["rows"]) + "\n")
        print(json.dumps(out["machine"]))
        print(table(out["rows"]))


if __name__ == "__main__":
    main()
