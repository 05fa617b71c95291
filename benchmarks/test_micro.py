"""Micro-benchmarks with parameters: the steps an object and a query go through, one at a time.

Each takes real places (the suite's objects) and real queries; the figures they stand behind are
in docs/performance.md ("What we learned")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.bulk_parse import parse_objects
from knnmon.ingest.reading import read_objects
from knnmon.keywords import normalize_keywords
from knnmon.oracle import BruteForceKnn


@pytest.fixture(scope="module")
def places(objects_dir) -> pa.Table:
    return read_objects(objects_dir)


def _entries(places: pa.Table, n: int) -> list[tuple[str, dict[str, str]]]:
    rows = places.slice(0, n).select(["id", "lon", "lat", "t", "keywords"]).to_pylist()
    return [(f"{o['t']}-{i}", {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]), "t": str(o["t"]),
                               "keywords": " ".join(o["keywords"])}) for i, o in enumerate(rows)]


@pytest.mark.parametrize("batch", (100, 1000, 5000))
def test_parse_a_batch_of_stream_entries(benchmark, places, batch):
    """The service's one parse of a batch of object entries into columns (:mod:`knnmon.bulk_parse`)."""
    entries = _entries(places, batch)
    parsed = benchmark(parse_objects, entries)
    assert int(parsed.ok.sum()) + len(parsed.rejects) == batch and int(parsed.ok.sum()) > 0.9 * batch


@pytest.mark.parametrize("stem", (False, True))
def test_normalize_a_tweet_text(benchmark, stem):
    """A text's keywords: tokenised, stop words removed, optionally Snowball-stemmed (:mod:`knnmon.keywords`)."""
    text = "Great coffee and bagels at the corner cafe on Main Street this morning! #breakfast @friend"
    keywords = benchmark(normalize_keywords, text, stem=stem)
    assert "coffee" in keywords or "coffe" in keywords


@pytest.mark.parametrize("k", (1, 10, 100))
def test_the_oracle_answers_one_query(benchmark, places, queries_file, k):
    """The brute-force oracle every test checks against: one query over every object."""
    oracle = BruteForceKnn(places)
    q = pq.read_table(queries_file).slice(0, 1).to_pylist()[0]
    answer = benchmark(oracle.knn, q["lon"], q["lat"], q["keywords"], k)
    assert len(answer) <= k


@pytest.mark.parametrize("algorithm", ("proposed", "keyword", "space", "random"))
def test_plan_the_queries(benchmark, objects_dir, queries_file, scale, algorithm):
    """The assignment of the suite's queries to workers (the paper, §4; :mod:`knnmon.coordinator.planning`)."""
    from knnmon.coordinator.planning import make_plan

    result = benchmark.pedantic(make_plan, args=(objects_dir, queries_file, scale.workers, algorithm),
                                kwargs={"initial": scale.initial}, rounds=1, iterations=1)
    benchmark.extra_info["imbalance"] = result.summary["imbalance"]
    benchmark.extra_info["deliveries_per_object"] = result.summary["deliveries_per_object"]
    assert result.summary["queries"] == scale.queries


@pytest.fixture(scope="module")
def region_entries(objects_dir, queries_file, scale):
    """The queries' kNN-region boxes, one entry per (query, keyword) (a worker's R-tree's
    entries), and the next 1,000 objects' (object, keyword) points."""
    import numpy as np

    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.preparation import prepare
    from knnmon.geo import cap_bbox

    prepared = prepare(objects_dir, queries_file, RunConfig(initial=scale.initial, batches=1, batch=1000))
    q = prepared.queries
    x0, y0, x1, y1 = cap_bbox(q.column("lon").to_numpy(), q.column("lat").to_numpy(), prepared.radius)
    codes: dict[str, int] = {}
    words = q.column("keywords").to_pylist()
    per = np.fromiter(map(len, words), np.int64, len(words))
    code = np.array([codes.setdefault(w, len(codes)) for ws in words for w in ws], np.int64)
    boxes = tuple(np.repeat(v, per) for v in (x0, y0, x1, y1))
    batch = prepared.stream.slice(0, 1000)
    bw = batch.column("keywords").to_pylist()
    bper = np.fromiter(map(len, bw), np.int64, len(bw))
    known = np.array([w in codes for ws in bw for w in ws], bool)
    pc = np.array([codes.get(w, -1) for ws in bw for w in ws], np.int64)[known]
    px = np.repeat(batch.column("lon").to_numpy(), bper)[known]
    py = np.repeat(batch.column("lat").to_numpy(), bper)[known]
    return boxes, code, (px, py, pc)


@pytest.mark.parametrize("index", ("packed", "libspatialindex"))
def test_search_a_batch_in_the_query_regions(benchmark, region_entries, index):
    """A batch's (object, keyword) points against the queries' kNN-region boxes: knnmon's packed
    R-tree (:mod:`knnmon.workers.packed_rtree`, searched for the whole batch level by level)
    against the ``rtree`` library's vectorised ``intersection_v`` on the same entries
    (docs/architecture.md, "Why each index is what it is"); both find the same (point, entry) pairs."""
    from knnmon.workers.packed_rtree import PackedRTree

    (x0, y0, x1, y1), code, (px, py, pc) = region_entries
    packed = PackedRTree(x0, y0, x1, y1, code, fanout=16)
    want = set(zip(*(a.tolist() for a in packed.search(px, py, pc))))
    if index == "packed":
        pair, entry = benchmark(packed.search, px, py, pc)
        got = set(zip(pair.tolist(), entry.tolist()))
    else:
        from rtree import index as rindex

        props = rindex.Property()
        props.dimension = 3
        lib = rindex.Index(((i, (x0[i], y0[i], float(code[i]), x1[i], y1[i], float(code[i])), None)
                            for i in range(len(code))), properties=props)
        pts = np.column_stack([px, py, pc.astype(np.float64)])
        ids, counts = benchmark(lib.intersection_v, pts, pts)
        got = set(zip(np.repeat(np.arange(len(px)), counts.astype(np.int64)).tolist(), ids.tolist()))
    assert got == want


@pytest.mark.parametrize("algorithm", ("proposed", "keyword", "space", "random"))
def test_route_a_batch_of_objects(benchmark, objects_dir, queries_file, places, scale, algorithm):
    """The coordinator's routing of 1,000 objects to the workers whose queries they may change
    (the plan's routing table, :class:`~knnmon.coordinator.live_routing.LiveRouting`):
    ``extra_info`` holds the deliveries per object the plan costs."""
    from knnmon.coordinator.planning import make_plan

    plan = make_plan(objects_dir, queries_file, scale.workers, algorithm, initial=scale.initial)
    batch = places.slice(scale.initial, 1000)
    lon, lat, words = batch.column("lon").to_numpy(), batch.column("lat").to_numpy(), batch.column("keywords")
    masks = benchmark(plan.routing.route_objects, lon, lat, words.combine_chunks())
    deliveries = float(np.bitwise_count(masks.astype(np.uint64)).sum() / len(masks))
    benchmark.extra_info["deliveries_per_object"] = deliveries
    assert len(masks) == batch.num_rows and 0 < deliveries <= scale.workers


@pytest.mark.parametrize("processes", (1, 2))
def test_search_every_query_s_initial_knn(benchmark, objects_dir, queries_file, scale, processes):
    """A start's exact kNN of every query over the initial objects (the load model's statistics,
    the split, the search; :func:`~knnmon.coordinator.runtime.preparation.prepare`)."""
    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.coordinator.runtime.preparation import prepare

    config = RunConfig(initial=scale.initial, batches=1, processes=processes)
    prepared = benchmark.pedantic(prepare, args=(objects_dir, queries_file, config), rounds=1, iterations=1)
    benchmark.extra_info["timings_s"] = prepared.timings
    assert len(prepared.radius) == scale.queries
