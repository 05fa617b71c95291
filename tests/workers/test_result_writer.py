"""Redis writes against a real server: the layout, reference counts, exactly-once retries."""

from __future__ import annotations

import pytest
import redis

from knnmon.batch import BatchChanges, ObjectInfo
from knnmon.connection import connect, with_retries
from knnmon.errors import StoreUnavailableError
from knnmon.keys import Keys
from knnmon.workers.result_writer import ResultWriter

OBJ = {f"o{i}": ObjectInfo(-71.0 - i / 100, 41.0, 1_000 + i, ["coffee", "shop"]) for i in range(5)}


def test_layout_and_reference_counts(redis_url, namespace):
    w, keys, c = ResultWriter(redis_url, namespace, 3), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [("q1", {"lon": "-71.0", "lat": "41.0", "keywords": "coffee", "k": 2, "version": 0},
                          [("o0", 0.0), ("o1", 5.5)]),
                         ("q2", {"lon": "-71.1", "lat": "41.0", "keywords": "shop", "k": 1, "version": 0},
                          [("o1", 7.0)])], OBJ)
    assert c.zrange(keys.result("q1"), 0, -1, withscores=True) == [("o0", 0.0), ("o1", 5.5)]
    assert c.hgetall(keys.query("q2")) == {"lon": "-71.1", "lat": "41.0", "keywords": "shop", "k": "1",
                                           "version": "0", "worker": "3"}
    assert c.hget(keys.object("o1"), "refs") == "2" and c.hget(keys.object("o1"), "keywords") == "coffee shop"
    w.write_batch(0, BatchChanges.from_diffs([("q1", 1, [("o2", 1.25)], ["o1"]), ("q2", 1, [("o3", 2.0)], ["o1"])], OBJ))
    assert c.zrange(keys.result("q1"), 0, -1, withscores=True) == [("o0", 0.0), ("o2", 1.25)]
    assert not c.exists(keys.object("o1"))  # its last result let it go
    assert c.hgetall(keys.object("o2"))["lon"] == repr(OBJ["o2"].lon)
    entries = [f for _, f in c.xrange(keys.changes)]
    assert entries == [{"qid": "q1", "entered": "o0 o1", "left": "", "version": "0"},  # the registrations
                       {"qid": "q2", "entered": "o1", "left": "", "version": "0"},
                       {"qid": "q1", "entered": "o2", "left": "o1", "version": "1"},
                       {"qid": "q2", "entered": "o3", "left": "o1", "version": "1"}]
    w.delete_query(-2, "q1")
    assert c.xrevrange(keys.changes, count=1)[0][1] == {"qid": "q1", "entered": "", "left": "o0 o2", "version": "2"}
    assert not c.exists(keys.result("q1"), keys.query("q1"), keys.object("o0"), keys.object("o2"))
    assert c.exists(keys.object("o3"))


def test_a_resent_batch_is_applied_once(redis_url, namespace, monkeypatch):
    """The reply of the first attempt is lost after the script ran; the retry must change nothing."""
    w, keys, c = ResultWriter(redis_url, namespace, 0), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [("q", {"k": 3, "version": 0}, [])], OBJ)
    script = w._apply
    calls = {"n": 0}

    def lossy(*args, **kwargs):
        result = script(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.ConnectionError("reply lost (injected)")
        return result

    monkeypatch.setattr(w, "_apply", lossy)
    w.write_batch(7, BatchChanges.from_diffs([("q", 1, [("o4", 3.0)], [])], OBJ))
    assert calls["n"] == 2
    assert c.xlen(keys.changes) == 2 and c.hget(keys.object("o4"), "refs") == "1"  # registration + change


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

    monkeypatch.setattr(result_writer, "CHANGES_MAXLEN", 10)
    w, keys, c = ResultWriter(redis_url, namespace, 0), Keys(namespace), connect(redis_url)
    w.write_queries(-1, [(f"q{i}", {"k": 1, "version": 0}, []) for i in range(300)], {})
    for b in range(3):  # 300 entries per batch; approximate trimming drops whole stream nodes
        w.write_batch(b, BatchChanges.from_diffs([(f"q{i}", b + 1, [(f"o{b % 5}", 1.0)], [f"o{(b - 1) % 5}"] if b else [])
                                                  for i in range(300)], OBJ))
    assert 10 <= c.xlen(keys.changes) < 300
    assert c.xrevrange(keys.changes, count=1)[0][1]["version"] == "3"  # the newest entries stay
