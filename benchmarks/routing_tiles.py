"""Workers an object reaches under a bounded routing table, by how the build holds the pairs the
bound leaves out of the cells (issue 37): sent everywhere (``tiles=0``) or as rectangles per
tile of a ``t x t`` cut of the grid (``assignment/routing_regions.py``). Plan only, no run.

    python benchmarks/routing_tiles.py --objects /tmp/synth20m --queries /tmp/sq1m.parquet --n 1000000 \\
        --workers 12 --algorithms proposed,random --tiles 0,1,4,16

Each plan is made once (exact kNN radii over the first ``--initial`` objects), then its table is
built for each ``--tiles`` and routes the same ``--sample`` initial objects.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--algorithms", default="proposed,random")
    p.add_argument("--tiles", default="0,1,4,16")
    p.add_argument("--initial", type=int, default=1_000_000)
    p.add_argument("--sample", type=int, default=20_000)
    p.add_argument("--max-entries", type=int, default=16_000_000, help="the table's bound (--routing-entries)")
    a = p.parse_args()

    from knnmon.assignment import LoadModel
    from knnmon.assignment.routing import RoutingTable, popcount
    from knnmon.coordinator.planning import plan_workload
    from knnmon.coordinator.runtime.object_index import ObjectIndex
    from knnmon.ingest.reading import initial_objects, load_queries

    model = LoadModel.from_ingest(a.objects)
    queries = load_queries(a.queries).slice(0, a.n)
    objects = initial_objects(a.objects, a.initial).select(["id", "lon", "lat", "keywords"])
    radius = ObjectIndex(objects).kth_distance_m(queries.column("lon").to_numpy(), queries.column("lat").to_numpy(),
                                                 queries.column("keywords"), queries.column("k").to_numpy())
    pick = np.sort(np.random.default_rng(0).choice(objects.num_rows, min(a.sample, objects.num_rows), replace=False))
    sample = objects.take(pa.array(pick))
    lon, lat, keywords = sample.column("lon").to_numpy(), sample.column("lat").to_numpy(), sample.column("keywords")
    print("| plan | tiles | workers per object | rectangles | cell entries |")
    print("|---|---|---|---|---|")
    for algorithm in a.algorithms.split(","):
        res = plan_workload(model, queries, objects, radius, a.workers, algorithm, sample_size=1)
        for tiles in (int(t) for t in a.tiles.split(",")):
            table = RoutingTable.build(res.workload, model, res.plan, max_entries=a.max_entries, tiles=tiles)
            reached = popcount(table.route_objects(lon, lat, keywords)).mean()
            print(f"| {algorithm} | {tiles} | {reached:.2f} | {len(table.regions):,} | {len(table.keys):,} |",
                  flush=True)


if __name__ == "__main__":
    main()
