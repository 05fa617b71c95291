"""Micro-benchmarks with parameters: the steps an object and a query go through, one at a time.

Each takes real places (the suite's objects) and real queries; the figures they stand behind are
in docs/performance.md ("What we learned")."""

from __future__ import annotations

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
