"""``queries generate``: the paper's workload, deterministic for a seed, drawn from real objects."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.errors import InputPathError, InvalidArgumentError
from knnmon.ingest.jobs import ingest_places
from knnmon.ingest.queries import QUERY_SCHEMA, QueryWorkload, generate_queries, write_queries
from knnmon.ingest.reading import read_objects


@pytest.fixture(scope="module")
def objects_dir(spark, place_lines, tmp_path_factory):
    out = tmp_path_factory.mktemp("nh")
    src = out / "nh.geojson"
    src.write_text("\n".join(place_lines("nh", 5000)) + "\n")
    ingest_places([str(src)], str(out / "objects"))
    return str(out / "objects")


def test_deterministic_for_a_seed(objects_dir):
    objects = read_objects(objects_dir)
    a = generate_queries(objects, QueryWorkload(n=2000, k_max=10, seed=7))
    b = generate_queries(objects, QueryWorkload(n=2000, k_max=10, seed=7))
    c = generate_queries(objects, QueryWorkload(n=2000, k_max=10, seed=8))
    assert a.equals(b)
    assert not a.equals(c)
    # The order of the objects on disk does not matter.
    shuffled = objects.take(pa.array(list(reversed(range(objects.num_rows)))))
    assert generate_queries(shuffled, QueryWorkload(n=2000, k_max=10, seed=7)).equals(a)


def test_queries_follow_the_paper(objects_dir):
    objects = read_objects(objects_dir).to_pylist()
    q = generate_queries(read_objects(objects_dir), QueryWorkload(n=3000, k_max=5, seed=1)).to_pylist()
    at = {}
    for o in objects:
        at.setdefault((o["lon"], o["lat"]), []).append(set(o["keywords"]))
    assert len({r["id"] for r in q}) == 3000
    for r in q:
        assert 1 <= r["k"] <= 5
        assert 1 <= len(r["keywords"]) <= 3 and r["keywords"] == sorted(set(r["keywords"]))
        assert any(set(r["keywords"]) <= kws for kws in at[(r["lon"], r["lat"])])  # an object's location + keywords
    sizes = Counter(len(r["keywords"]) for r in q)
    assert sizes[1] > 0 and sizes[2] > 0 and sizes[3] > 0
    assert Counter(r["k"] for r in q).keys() == {1, 2, 3, 4, 5}


def test_file_round_trip(objects_dir, tmp_path):
    q = generate_queries(read_objects(objects_dir), QueryWorkload(n=100, k_max=3, seed=0))
    write_queries(q, str(tmp_path / "sub" / "q.parquet"))
    back = pq.read_table(tmp_path / "sub" / "q.parquet")
    assert back.schema.equals(QUERY_SCHEMA) and back.equals(q)


def test_bad_input(objects_dir, tmp_path):
    n = read_objects(objects_dir).num_rows
    with pytest.raises(InvalidArgumentError, match=f"cannot seed {n + 1} queries from {n} objects"):
        generate_queries(read_objects(objects_dir), QueryWorkload(n=n + 1, k_max=3))
    with pytest.raises(InvalidArgumentError, match="--kmax must be >= 1"):
        QueryWorkload(n=1, k_max=0)
    with pytest.raises(InvalidArgumentError, match="--n"):
        QueryWorkload(n=0, k_max=1)
    with pytest.raises(InputPathError, match="no objects.parquet"):
        read_objects(str(tmp_path))
