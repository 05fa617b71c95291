"""``ingest places`` on real SimpleGeo slices plus injected bad records, against a Python reference."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.grid import Grid
from knnmon.ingest.jobs import ingest_places
from knnmon.keywords import normalize_keywords
from knnmon.errors import Rejected
from knnmon.ingest.records import REJECT_REASONS
from knnmon.limits import DEFAULT_LIMITS, parse_id

GOOD = {"type": "Feature", "id": "SG_good_1@1300000000",
        "geometry": {"type": "Point", "coordinates": [-71.4, 41.8]},
        "properties": {"name": "Blue Bottle", "classifiers": [{"type": "Food & Drink", "category": "Cafe",
                                                               "subcategory": ""}], "tags": ["Coffee Shop"]}}


def _with(**changes):
    d = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        node = d
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        if value is ...:
            node.pop(keys[-1])
        else:
            node[keys[-1]] = value
    return json.dumps(d)


#: One injected record per reason (two kinds of malformed JSON), keyed by a unique id.
INJECTED = [
    ('{"type":"Feature","id":"SG_trunc@1", "geometry":', "malformed_json"),
    (_with(id="SG_tagstr@1", properties__tags="not a list"), "malformed_json"),
    ('[1, 2, 3]', "malformed_json"),
    (_with(id="SG_poly@1", geometry={"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0]]]}), "not_a_point"),
    (_with(id=...), "missing_id"),
    (_with(id="SG_nocoord@1", geometry__coordinates=[]), "missing_coordinates"),
    (_with(id="SG_abc@1", geometry__coordinates=["abc", 41.0]), "non_numeric_coordinates"),
    (_with(id="SG_nan@1", geometry__coordinates=["NaN", 41.0]), "non_numeric_coordinates"),
    (_with(id="SG_lat@1", geometry__coordinates=[-71.0, 95.0]), "latitude_out_of_range"),
    (_with(id="SG_lon@1", geometry__coordinates=[-181.0, 41.0]), "longitude_out_of_range"),
    (_with(id="SG_zero@1", geometry__coordinates=[0.0, 0.0]), "null_island"),
    (_with(id="SG_noversion"), "bad_time"),
    (_with(id="SG_badversion@soon"), "bad_time"),
    (_with(id="SG_nokw@1", properties__classifiers=[], properties__tags=["the", "&", "42"]), "no_keywords"),
    (_with(id="SG_good_1@1200000000", geometry__coordinates=[-70.0, 40.0]), "duplicate_id"),  # older version
    # The bounds knnmon serve applies to a stream entry hold here too (one set at every entry point).
    (_with(id="SG bad\tid@1"), "bad_id"),
    (_with(id="SG_" + "x" * 300 + "@1"), "bad_id"),
    (_with(id="SG_manykw@1", properties__tags=[f"kw{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(34)]),
     "too_many_keywords"),
]


def reference(line: str):
    """The reject rules in plain Python: ``(reason or None, object or None)``."""
    try:
        d = json.loads(line)
    except ValueError:
        return "malformed_json", None
    if not isinstance(d, dict):
        return "malformed_json", None
    props, geom = d.get("properties") or {}, d.get("geometry") or {}
    if not isinstance(props.get("tags") or [], list) or not isinstance(props.get("classifiers") or [], list):
        return "malformed_json", None
    if geom.get("type") not in (None, "Point"):
        return "not_a_point", None
    sid = d.get("id")
    oid = sid.split("@")[0] if sid is not None else None
    if not oid or not oid.strip():
        return "missing_id", None
    try:
        parse_id(oid)
    except Rejected as r:
        return r.reason, None
    coords = geom.get("coordinates") or []
    if len(coords) < 2 or coords[0] is None or coords[1] is None:
        return "missing_coordinates", None
    try:
        lon, lat = float(coords[0]), float(coords[1])
    except (TypeError, ValueError):
        return "non_numeric_coordinates", None
    if not (math.isfinite(lon) and math.isfinite(lat)):
        return "non_numeric_coordinates", None
    if not -90 <= lat <= 90:
        return "latitude_out_of_range", None
    if not -180 <= lon <= 180:
        return "longitude_out_of_range", None
    if lon == 0 and lat == 0:
        return "null_island", None
    version = sid.split("@", 1)[1] if "@" in sid else ""
    if not version.isdigit():
        return "bad_time", None
    texts = [x for c in props.get("classifiers") or [] for x in (c.get("type"), c.get("category"), c.get("subcategory"))]
    kw = normalize_keywords(texts + list(props.get("tags") or []))
    if not kw:
        return "no_keywords", None
    if len(kw) > DEFAULT_LIMITS.max_keywords:
        return "too_many_keywords", None
    return None, {"id": oid, "lon": lon, "lat": lat, "t": int(version) * 1000, "keywords": kw}


@pytest.fixture(scope="module")
def places_run(spark, place_lines, tmp_path_factory):
    src = tmp_path_factory.mktemp("places_in")
    lines = place_lines("ri", 1500) + place_lines("de", 1500)
    (src / "real.geojson").write_text("\n".join(lines) + "\n")
    injected = [json.dumps(GOOD)] + [rec for rec, _ in INJECTED]
    (src / "injected.geojson").write_text("\n".join(injected[:3]) + "\n\n   \n" + "\n".join(injected[3:]) + "\n")
    out = tmp_path_factory.mktemp("places_out")
    manifest = ingest_places([str(src)], str(out), grid_n=16)
    return {"out": Path(out), "manifest": manifest, "lines": lines + injected}


def test_every_record_is_counted_once(places_run):
    rec = places_run["manifest"].records
    assert rec.read == len(places_run["lines"]) == rec.kept + rec.rejected  # blank lines are not records
    assert rec.rejected == sum(rec.rejected_by_reason.values())
    assert set(rec.rejected_by_reason) <= set(REJECT_REASONS)
    written = json.loads((places_run["out"] / "manifest.json").read_text())
    assert written == places_run["manifest"].to_json() and written["kind"] == "places"


def test_each_injected_record_is_rejected_with_its_reason(places_run):
    rejects = [json.loads(x) for f in sorted((places_run["out"] / "rejects").glob("*.json")) for x in f.open()]
    by_record = {r["record"]: r for r in rejects}
    for record, reason in INJECTED:
        assert by_record[record]["reason"] == reason, record
        assert by_record[record]["source"].endswith("injected.geojson")


def test_outcomes_equal_the_python_reference(places_run):
    expected_reasons = Counter()
    newest: dict[str, dict] = {}
    for line in places_run["lines"]:
        reason, obj = reference(line)
        if reason:
            expected_reasons[reason] += 1
        elif obj["id"] in newest:
            expected_reasons["duplicate_id"] += 1
            if obj["t"] > newest[obj["id"]]["t"]:
                newest[obj["id"]] = obj
        else:
            newest[obj["id"]] = obj
    assert places_run["manifest"].records.rejected_by_reason == dict(expected_reasons)
    got = pq.read_table(places_run["out"] / "objects.parquet").to_pylist()
    assert len(got) == len(newest)
    for o in got:
        assert o == newest[o["id"]]
    assert newest["SG_good_1"]["t"] == 1_300_000_000_000  # the newer version won


def test_objects_schema_order_and_keywords(places_run):
    table = pq.read_table(places_run["out"] / "objects.parquet")
    assert table.schema.names == ["id", "lon", "lat", "t", "keywords"]
    assert [table.schema.field(n).type for n in table.schema.names] == [
        pa.string(), pa.float64(), pa.float64(), pa.int64(), pa.list_(pa.string())]
    order = list(zip(table.column("t").to_pylist(), table.column("id").to_pylist()))
    assert order == sorted(order)
    good = [r for r in table.to_pylist() if r["id"] == "SG_good_1"][0]
    assert good["keywords"] == ["cafe", "coffee", "drink", "food", "shop"]
    # Round trip: what pyarrow writes back reads identically.
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    assert pq.read_table(pa.BufferReader(buf.getvalue())).equals(table)


def test_stats_equal_a_numpy_recount(places_run):
    m = places_run["manifest"]
    grid = Grid.from_dict(m.grid)
    objects = pq.read_table(places_run["out"] / "objects.parquet").to_pylist()
    cells = grid.cell_of(np.array([o["lon"] for o in objects]), np.array([o["lat"] for o in objects]))
    want = Counter((int(c), w) for c, o in zip(cells, objects) for w in o["keywords"])
    stats = pq.read_table(places_run["out"] / "stats.parquet").to_pylist()
    assert {(r["cell"], r["keyword"]): r["count"] for r in stats} == dict(want)
    assert all(r["cell"] == r["cy"] * grid.n + r["cx"] for r in stats)
    assert m.bbox == [min(o["lon"] for o in objects), min(o["lat"] for o in objects),
                         max(o["lon"] for o in objects), max(o["lat"] for o in objects)]
    assert m.distinct_keywords == len({w for o in objects for w in o["keywords"]})
    assert m.mean_keywords_per_object == pytest.approx(np.mean([len(o["keywords"]) for o in objects]))


def test_with_names_adds_name_words(spark, tmp_path):
    src = tmp_path / "one.geojson"
    src.write_text(_with(id="SG_named@1", properties__classifiers=[], properties__tags=[]) + "\n")
    plain = ingest_places([str(src)], str(tmp_path / "plain"))
    named = ingest_places([str(src)], str(tmp_path / "named"), with_names=True, stem=True)
    assert plain.records.rejected_by_reason == {"no_keywords": 1}
    assert named.records.kept == 1
    assert pq.read_table(tmp_path / "named" / "objects.parquet").column("keywords").to_pylist() == [["blue", "bottl"]]
