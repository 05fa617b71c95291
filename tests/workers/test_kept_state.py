"""What a worker that outlived its service says of its state (``workers/kept_state.py``): equal
to Redis's (its marker is its last write) after loads and batches, not after a failed write; an
expiry's queries to refill asked for again until its batch comes with their refills (a query
dropped meanwhile needs none; a refill searched for a query registered again since with other
parameters is not taken); which objects its lists hold; a new session once kept."""

from __future__ import annotations

import numpy as np
import redis

from knnmon.batch import KnnColumns, ObjectColumns
from knnmon.geo import haversine_m
from knnmon.keys import Keys
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings


def _batch(w: KnnWorker, number: int, ids: list[str], t: list[int], **kw):
    n = len(ids)
    return w.process_batch(number, ids, np.full(n, -71.0) + 0.001 * np.arange(n), np.full(n, 42.0), np.asarray(t),
                           [["cafe"]] * n, **kw)


def _refills(queries: QueryColumns, top: KnnColumns, objects: ObjectColumns) -> Refills:
    """Refills as the coordinator sends them: each entry with its object's row in ``objects``."""
    rows = [list(objects.ids).index(o) for o in top.ids]
    return Refills(queries, KnnColumns(top.counts, top.ids, top.dist, rows), objects)


def _with_k(q: QueryColumns, k: int) -> QueryColumns:
    return QueryColumns(q.ids, q.lon, q.lat, q.keywords, np.full(len(q), k, dtype=np.int64))


def test_a_worker_says_when_its_state_equals_what_redis_holds(redis_url, namespace):
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    w = KnnWorker(0, WorkerSettings(redis_url, namespace, reserve=1))
    q = QueryColumns(["q1", "q2"], np.array([-71.0, -71.5]), np.array([42.0, 42.0]), [("cafe",), ("bar", "cafe")],
                     np.array([2, 1], dtype=np.int64))
    w.load_queries(q, [[], []], {}, vocabulary={"cafe": 5, "bar": 9})
    state = w.kept_state()
    assert state.why is None and state.queries == 2 and state.marker == r.get(keys.worker_batch(0))
    _batch(w, 0, ["o1", "o2", "o3", "o4"], [1000, 2000, 3000, 4000])
    state = w.kept_state()
    assert state.why is None and state.marker == r.get(keys.worker_batch(0)) == f"{w.state.writer.session}:0"
    held = {o for qid in ("q1", "q2") for o, _ in w.result(qid)}
    assert held and set(w.holds_among(["o1", "o2", "o3", "o4", "nope"])) >= held
    assert "nope" not in w.holds_among(["nope"])
    # An expiry whose batch never came: its queries to refill are asked for again until it comes.
    need = w.expire(1500)
    assert len(need.ids) and list(w.expire(1500).ids) == list(need.ids)
    assert set(w.expire(1600).ids) >= set(need.ids)
    # The batch without their refills is not applied: it names them (the coordinator sends it again).
    short = _batch(w, 1, [], [], cutoff=1600).short
    assert short is not None and set(short.ids) == set(w.expire(1600).ids)
    assert w.kept_state().marker == f"{w.state.writer.session}:0"
    lon = np.array([-70.999, -70.998, -70.997])
    live = ObjectColumns(["o2", "o3", "o4"], lon, np.full(3, 42.0), np.array([2000, 3000, 4000]), [["cafe"]] * 3)
    d = [haversine_m(lon, np.full(3, 42.0), np.full(3, x), np.full(3, 42.0)).tolist() for x in short.lon]
    top = KnnColumns([3] * len(d), ["o2", "o3", "o4"] * len(d), np.array([x for row in d for x in row]))
    texts, had = len(w.state.details._texts), set(w.holds_among(["o2", "o3", "o4"]))
    assert _batch(w, 1, [], [], cutoff=1600, refills=_refills(short, top, live)).short is None
    # The texts of refilled objects held already are kept once, not appended again.
    assert had and len(w.state.details._texts) == texts + 3 - len(had) and all(w.state.details.get(["o2", "o3", "o4"]))
    assert not len(w.expire(1600).ids)
    state = w.kept_state()
    assert state.why is None and state.marker == r.get(keys.worker_batch(0)) == f"{w.state.writer.session}:1"
    queries, radius, counts, codes = w.kept_queries()
    assert list(queries.ids) == ["q1", "q2"] and codes == {"cafe": 5, "bar": 9}
    assert counts.tolist() == [min(len(w.result("q1")), 2), min(len(w.result("q2")), 1)] and radius.shape == (2,)
    # Kept: a new session, so that the next service's batch 0 is not taken for this one's.
    before = w.state.writer.session
    assert w.keep_for() == 2 and w.state.writer.session != before
    _batch(w, 0, ["o5"], [5000])
    assert r.get(keys.worker_batch(0)) == f"{w.state.writer.session}:0"


def test_a_failed_write_means_the_state_is_not_redis(redis_url, namespace):
    w = KnnWorker(0, WorkerSettings(redis_url, namespace))
    w.load_queries(QueryColumns(["q1"], np.array([-71.0]), np.array([42.0]), [("cafe",)], np.array([1])), [[]], {},
                   vocabulary={"cafe": 0})
    w.state.writer._failed = True  # (as ResultWriter.apply leaves it when Redis stayed away)
    assert w.kept_state().why == "a write failed after its last one"
    assert KnnWorker(1).kept_state().why == "it writes no results"


def test_a_query_dropped_after_its_expiry_needs_no_refill(redis_url, namespace):
    """The expiry asked to refill q1 and q2, then q2 was unregistered (a service started anew on
    a kept worker): the batch with q1's refill alone is applied, not returned short for q2."""
    w = KnnWorker(0, WorkerSettings(redis_url, namespace, reserve=1))
    q = QueryColumns(["q1", "q2"], np.array([-71.0, -71.5]), np.array([42.0, 42.0]), [("cafe",), ("bar", "cafe")],
                     np.array([2, 1], dtype=np.int64))
    w.load_queries(q, [[], []], {}, vocabulary={"cafe": 5, "bar": 9})
    _batch(w, 0, ["o1", "o2", "o3", "o4"], [1000, 2000, 3000, 4000])
    assert set(w.expire(1500).ids) == {"q1", "q2"}
    assert w.unregister_query("q2")
    lon = np.array([-70.998, -70.997])
    live = ObjectColumns(["o3", "o4"], lon, np.full(2, 42.0), np.array([3000, 4000]), [["cafe"]] * 2)
    top = KnnColumns([2], ["o3", "o4"], haversine_m(lon, np.full(2, 42.0), np.full(2, -71.0), np.full(2, 42.0)))
    report = _batch(w, 1, [], [], cutoff=1500, refills=_refills(_with_k(q.take([0]), 3), top, live))
    assert report.short is None and [o for o, _ in w.result("q1")] == ["o3", "o4"]


def test_a_refill_searched_before_a_query_changed_is_not_taken(redis_url, namespace):
    """q1's deadline was announced with k = 1; q1 was registered again with k = 2 before the
    batch that reaches the deadline, whose refill was still searched for k = 1 (+ reserve).
    Taken, its 2 neighbours would fill q1's 3 places short, claim r_q = inf, and q1 would lose
    o5 and o6 once o3 and o4 expire; the worker leaves it out and returns q1 short instead."""
    w = KnnWorker(0, WorkerSettings(redis_url, namespace, reserve=1))
    old = QueryColumns(["q1"], np.array([-71.0]), np.array([42.0]), [("cafe",)], np.array([1], dtype=np.int64))
    w.load_queries(old, [[]], {}, vocabulary={"cafe": 5})
    ids, t = [f"o{i}" for i in range(1, 7)], [1000 * i for i in range(1, 7)]
    _batch(w, 0, ids, t)
    lon = np.full(6, -71.0) + 0.001 * np.arange(6)
    objects = ObjectColumns(ids, lon, np.full(6, 42.0), np.array(t), [["cafe"]] * 6)
    d = haversine_m(lon, np.full(6, 42.0), np.full(6, -71.0), np.full(6, 42.0))
    assert w.unregister_query("q1")
    new = _with_k(old, 2)
    w.register_queries(new, [[(o, float(x)) for o, x in zip(ids[:3], d[:3])]], objects.subset(ids[:3]))
    stale = KnnColumns([2], ids[2:4], d[2:4])  # (k + reserve = 2 of the live o3..o6)
    report = _batch(w, 1, [], [], cutoff=2500, refills=_refills(_with_k(old, 2), stale, objects.subset(ids[2:4])))
    assert report.short is not None and list(report.short.ids) == ["q1"] and list(report.short.k) == [3]
    fresh = KnnColumns([3], ids[2:5], d[2:5])
    assert _batch(w, 1, [], [], cutoff=2500, refills=_refills(report.short, fresh, objects.subset(ids[2:5]))).short \
        is None
    assert [o for o, _ in w.result("q1")] == ["o3", "o4"]
    assert list(w.expire(4500).ids) == ["q1"]  # (r_q is o5's distance, not inf: o6 may be needed)
