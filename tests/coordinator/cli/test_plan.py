"""``knnmon plan``: the files it writes, ``--explain``, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.coordinator.cli import main
from knnmon.coordinator.planning import make_plan
from knnmon.errors import InvalidArgumentError


def test_plan_writes_summary_assignment_sets_and_routing(places_slice, slice_queries, tmp_path, capsys):
    out = tmp_path / "plan"
    rc = main(["plan", "--objects", str(places_slice), "--queries", str(slice_queries), "--workers", "4",
               "--algorithm", "proposed", "--initial", "5000", "--set", "plan.beta=1000", "--out", str(out),
               "--explain", "q7"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    for key in ("algorithm", "workers", "worker_loads", "imbalance", "deliveries_per_object", "sets", "elapsed_s"):
        assert key in s
    assert s["algorithm"] == "proposed" and s["workers"] == 4 and len(s["worker_loads"]) == 4
    assert s["imbalance"] == pytest.approx(max(s["worker_loads"]) / np.mean(s["worker_loads"]))
    assert s["initial_objects"] == 5000
    a = pq.read_table(out / "assignment.parquet")
    assert a.num_rows == 4000 and set(a.column("worker").to_pylist()) <= {0, 1, 2, 3}
    assert len(json.loads((out / "sets.json").read_text())) == s["sets"]
    assert set(np.load(out / "routing.npz", allow_pickle=True).files) >= {"always", "keys", "masks"}
    printed = capsys.readouterr().out
    assert "imbalance (max/mean)" in printed and "query q7:" in printed and "L(q) = " in printed and "predicted cost" in printed
    worker_of_q7 = a.filter(pa.compute.equal(a.column("id"), "q7")).column("worker")[0].as_py()
    assert f"worker {worker_of_q7} (" in printed


def test_the_proposed_plan_is_more_even_than_keyword_and_space(places_slice, slice_queries):
    s = {a: make_plan(str(places_slice), str(slice_queries), 4, a, initial=5000, beta=1000).summary
         for a in ("proposed", "keyword", "space")}
    assert s["proposed"]["imbalance"] < min(s["keyword"]["imbalance"], s["space"]["imbalance"])


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--algorithm", "fancy"], "workers.algorithm = 'fancy' (--algorithm): Input should be 'keyword', 'proposed', "
                                "'random' or 'space'"),
     (["--workers", "0"], "workers.count = '0' (--workers): Input should be greater than or equal to 1"),
     (["--initial", "-1"], "run.initial = '-1' (--initial): Input should be greater than or equal to 0"),
     (["--set", "plan.routing_entries=-1"], "plan.routing_entries = '-1' (--set): Input should be greater than")],
)
def test_bad_arguments(places_slice, slice_queries, tmp_path, capsys, args, message):
    base = {"--objects": str(places_slice), "--queries": str(slice_queries), "--workers": "2",
            "--algorithm": "random", "--out": str(tmp_path / "p")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["plan"] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_query_files(places_slice, tmp_path):
    schema = pa.schema([("id", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()),
                        ("keywords", pa.list_(pa.string())), ("k", pa.int32())])
    empty = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), empty)
    with pytest.raises(InvalidArgumentError, match="holds no queries"):
        make_plan(str(places_slice), str(empty), 2, "random")
    bad_k = tmp_path / "badk.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "lon": [-72.0, -72.0], "lat": [44.0, 44.0],
                             "keywords": [["food"], ["food"]], "k": [1, 0]}, schema=schema), bad_k)
    with pytest.raises(InvalidArgumentError, match=r"1 invalid queries \(k < 1\), e.g. \['b'\]"):
        make_plan(str(places_slice), str(bad_k), 2, "random")


def test_outside_bbox_and_unknown_keywords_are_assigned_and_noted(places_slice, tmp_path, capsys):
    odd = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"id": ["far", "new", "ok"], "lon": [10.0, -72.0, -72.0], "lat": [50.0, 44.0, 44.0],
                             "keywords": [["food"], ["neverseenword"], ["food"]],
                             "k": pa.array([3, 3, 3], type=pa.int32())}), odd)
    assert main(["plan", "--objects", str(places_slice), "--queries", str(odd), "--workers", "2",
                 "--algorithm", "proposed", "--out", str(tmp_path / "p")]) == 0
    s = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert s["queries_outside_stats_bbox"] == 1 and s["queries_with_keywords_absent_from_stats"] == 1
    assert pq.read_table(tmp_path / "p" / "assignment.parquet").num_rows == 3
    out = capsys.readouterr().out
    assert "1 queries lie outside" in out and "absent from the statistics" in out
