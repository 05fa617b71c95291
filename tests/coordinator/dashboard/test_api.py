"""The dashboard's endpoints against a running service on real places: what they return equals the
oracle and the registered queries, bad requests get a 4xx with a message, the password never shows."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from knnmon.coordinator.cli.dashboard import parse_http
from knnmon.coordinator.dashboard.reader import MAX_LIMIT, BadRequest, parse_bbox
from knnmon.errors import InvalidArgumentError
from tests.coordinator.dashboard.conftest import SECRET


def _get(served, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(served.http + path, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read().decode()


def test_results_equal_the_oracle_with_details_and_the_knn_radius(served):
    rows = served.queries.to_pylist()
    rng = np.random.default_rng(0)
    nonempty = 0
    for q in [rows[i] for i in rng.choice(len(rows), 60, replace=False).tolist()]:
        code, body = _get(served, f"/api/results/{q['id']}")
        assert code == 200, body
        got = json.loads(body)
        want = served.oracle().knn(q["lon"], q["lat"], q["keywords"], q["k"])
        assert [o["id"] for o in got["result"]] == [o for o, _ in want], q["id"]
        assert np.allclose([o["distance_m"] for o in got["result"]], [d for _, d in want], rtol=1e-6)
        assert got["query"]["k"] == q["k"] and got["query"]["keywords"] == list(q["keywords"])
        assert got["radius_m"] == (want[-1][1] if len(want) >= q["k"] else None) or np.isclose(got["radius_m"],
                                                                                            want[-1][1])
        by_id = {p["id"]: p for p in served.published}
        for o in got["result"]:  # each neighbour's details, as published
            assert (o["lon"], o["lat"]) == (by_id[o["id"]]["lon"], by_id[o["id"]]["lat"])
        nonempty += bool(want)
    assert nonempty >= 20


def test_queries_in_a_box_are_counted_exactly_and_thinned_to_the_limit(served):
    q = served.queries
    lon, lat = np.asarray(q.column("lon")), np.asarray(q.column("lat"))
    w, s, e, n = float(np.quantile(lon, 0.2)), float(np.quantile(lat, 0.2)), float(np.quantile(lon, 0.8)), \
        float(np.quantile(lat, 0.8))
    code, body = _get(served, f"/api/queries?bbox={w},{s},{e},{n}&limit=50")
    assert code == 200, body
    got = json.loads(body)
    inside = (lon >= w) & (lon <= e) & (lat >= s) & (lat <= n)
    assert got["total"] == int(inside.sum()) and got["registered"] == q.num_rows
    assert got["returned"] == len(got["queries"]) == min(50, int(inside.sum()))
    ids = set(np.asarray(q.column("id"))[inside].tolist())
    assert {x["id"] for x in got["queries"]} <= ids
    assert sum(c[4] for c in got["cells"]) == got["total"] == sum(got["workers"])
    assert {x["worker"] for x in got["queries"]} <= {0, 1}
    # The same thinning whatever the box: a query shown in the box is shown in a larger one too.
    _, body2 = _get(served, f"/api/queries?bbox={w},{s},{e},{n}&limit=5000")
    assert {x["id"] for x in json.loads(body2)["queries"]} == ids


def test_status_has_per_worker_load_throughput_and_latency(served):
    code, body = _get(served, "/api/status")
    assert code == 200
    s = json.loads(body)
    assert s["running"] and s["queries"] == served.queries.num_rows
    w = s["workers"]
    assert sum(w["queries"]) == served.queries.num_rows
    # (every query arrived by registration: no plan predicted their loads)
    assert w["predicted_load"] is None or np.isclose(sum(w["predicted_load"]), 1, atol=1e-3)
    assert np.isclose(sum(w["measured_load"]), 1, atol=1e-3) and min(w["measured_load"]) > 0
    assert s["recent"]["objects"] > 0 and s["recent"]["latency_ms_p50"] > 0
    assert s["recent"]["latency_ms_p99"] >= s["recent"]["latency_ms_p50"]


@pytest.mark.parametrize("path, code, message", [
    ("/api/results/no-such-query", 404, "no query"),
    ("/api/queries?bbox=1,2,3", 400, "bbox"),
    ("/api/queries?bbox=a,b,c,d", 400, "bbox"),
    ("/api/queries?bbox=10,0,-10,5", 400, "west <= east"),
    ("/api/queries?bbox=0,0,1,nan", 400, "finite"),
    (f"/api/queries?limit={MAX_LIMIT + 1}", 400, "limit"),
    ("/api/queries?limit=lots", 400, "integer"),
    ("/api/changes?qid=" + "x" * 600, 400, "too long"),
    ("/api/nothing", 404, ""),
])
def test_bad_requests_get_a_4xx_with_a_message_and_no_stack_trace(served, path, code, message):
    got, body = _get(served, path)
    assert got == code
    assert message in json.loads(body)["error"]
    assert "Traceback" not in body and ".py" not in body


def test_the_live_feed_sends_status_objects_and_the_watched_query_s_changes(served):
    import time

    q = served.queries.to_pylist()[0]
    resp = urllib.request.urlopen(f"{served.http}/api/changes?qid={q['id']}", timeout=30)
    events, got_status = [], False
    # At the query's point with its keywords, an id that sorts first: it enters the kNN.
    obj = {"id": "000-dash-live-1", "lon": q["lon"], "lat": q["lat"], "t": int(time.time() * 1000),
           "keywords": list(q["keywords"])}
    published = False
    while not (got_status and any(e[0] == "changes" and e[1]["query"] for e in events)):
        name = data = None
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif not line and name:
                break
        events.append((name, data))
        got_status |= name == "status"
        if not published:
            served.publish(obj)
            published = True
        assert len(events) < 200
    resp.close()
    assert any(e[0] == "objects" and [obj["id"], q["lon"], q["lat"]] in e[1]["objects"] for e in events)
    change = next(e[1]["query"] for e in events if e[0] == "changes" and e[1]["query"])
    assert change[0][0] == q["id"] and obj["id"] in change[0][1]


def test_the_password_shows_nowhere(served):
    bodies = [_get(served, p)[1] for p in ("/", "/api/config", "/api/status", "/api/queries?limit=10",
                                           f"/api/results/{served.queries.column('id')[0].as_py()}",
                                           "/static/dashboard.js")]
    assert all(SECRET not in b for b in bodies)
    assert SECRET not in served.log.read_text()


def test_parsing_of_addresses_and_boxes():
    assert parse_http("127.0.0.1:8765") == ("127.0.0.1", 8765) and parse_http("[::1]:80") == ("::1", 80)
    for bad in ("8765", ":80", "host:", "host:99999", "host:x"):
        with pytest.raises(InvalidArgumentError):
            parse_http(bad)
    assert parse_bbox("-200,-100,200,100") == (-180, -90, 180, 90)
    with pytest.raises(BadRequest):
        parse_bbox("1,2,3,4," + "5" * 300)


def test_the_dashboard_listens_where_told_and_says_so_when_it_cannot():
    """``--http HOST:0`` binds a free port before the address is printed (so nothing can take it
    in between); an address in use is a clear error."""
    from knnmon.coordinator.cli.dashboard import _listen

    first = _listen("127.0.0.1", 0)
    try:
        port = first.getsockname()[1]
        assert port > 0
        first.listen()
        with pytest.raises(InvalidArgumentError, match=f"127.0.0.1:{port}: cannot listen there"):
            _listen("127.0.0.1", port)
    finally:
        first.close()


def test_the_reads_work_against_a_redis_cluster(redis_cluster_url, namespace):
    """What the dashboard reads, on a real 3-master Redis Cluster, written by a worker's writer."""
    from knnmon.batch import ObjectInfo
    from knnmon.connection import connect
    from knnmon.coordinator.dashboard.reader import QueryCache, read_result
    from knnmon.keys import Keys
    from knnmon.workers.result_writer import ResultWriter

    keys = Keys(namespace)
    objs = {f"o{i}": ObjectInfo(-72.0 + i / 100, 43.0, 1_000 + i, ["cafe"]) for i in range(6)}
    w = ResultWriter(redis_cluster_url, namespace, 1)
    qs = [(f"q{i}", {"lon": -72.0 + i / 10, "lat": 43.0, "keywords": "cafe", "k": 2},
           [(f"o{i}", 10.0 * i), (f"o{i + 1}", 10.0 * i + 5)]) for i in range(5)]
    w.write_queries(-1, qs, objs)
    assert len({w.masters.master_of(keys.result(q)) for q, _, _ in qs}) > 1
    client = connect(redis_cluster_url)
    got = QueryCache(client, keys).in_bbox((-72.05, 42.9, -71.55, 43.1), 10)
    assert got["total"] == got["registered"] == 5 and got["workers"] == [0, 5]
    r = read_result(client, keys, "q3")
    assert [(o["id"], o["distance_m"], o["lon"]) for o in r["result"]] == [("o3", 30.0, -71.97), ("o4", 35.0, -71.96)]
    assert r["radius_m"] == 35.0 and r["query"]["worker"] == "1"
    assert read_result(client, keys, "nope") is None
