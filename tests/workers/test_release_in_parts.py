"""A batch released in parts (Short-Job-First groups, each written as soon as it is done): the
same exact kNN as one write per batch, written exactly once per part, and a worker that dies
between two parts rebuilt from Redis and the batch's remaining rows only."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.batch import ObjectInfo
from knnmon.connection import connect
from knnmon.coordinator.runtime.revival import applied_state, rows_to_resend
from knnmon.ingest.reading import read_objects
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.query import Query, QueryColumns
from knnmon.workers.release_parts import sjf_groups
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings
from tests.workers.test_worker_merge import WORDS, _objects


def _queries(rng: np.random.Generator, nq: int) -> dict:
    return {"id": [f"q{i}" for i in range(nq)], "lon": rng.integers(-3, 4, nq) * 0.01,
            "lat": rng.integers(-3, 4, nq) * 0.01, "k": rng.integers(1, 5, nq),
            "keywords": [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(nq)]}


def _args(batch: pa.Table) -> tuple:
    return (batch.column("id").to_pylist(), batch.column("lon").to_numpy(), batch.column("lat").to_numpy(),
            batch.column("t").to_numpy(), batch.column("keywords").to_pylist())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batches=st.lists(st.integers(2, 40), min_size=1, max_size=4),
       groups=st.sampled_from([2, 3, 64]), index=st.sampled_from(["grid", "rtree"]), reserve=st.sampled_from([0, 2]),
       prefix=st.sampled_from(["o", "object-"]))
def test_parts_equal_one_write_per_batch_and_the_oracle(seed, batches, groups, index, reserve, prefix):
    rng = np.random.default_rng(seed)
    q = _queries(rng, 12)
    cols = QueryColumns(q["id"], q["lon"], q["lat"], q["keywords"], q["k"])
    whole = KnnWorker(0, WorkerSettings(index=index, reserve=reserve))
    parts = KnnWorker(1, WorkerSettings(index=index, reserve=reserve, release_groups=groups))
    for w in (whole, parts):
        w.load_queries(cols, [[] for _ in range(12)], {})
    seen, start = None, 0
    for b, size in enumerate(batches):
        batch = _objects(rng, size, start, prefix)
        start += size
        whole.process_batch(b, *_args(batch))
        r = parts.process_batch(b, *_args(batch))
        assert r.released is not None and sorted(r.released[0].tolist()) == list(range(size))
        seen = pa.concat_tables([seen, batch]) if seen is not None else batch
        oracle = BruteForceKnn(seen)
        for i, qid in enumerate(q["id"]):
            want = [o for o, _ in oracle.knn(q["lon"][i], q["lat"][i], q["keywords"][i], int(q["k"][i]))]
            assert [o for o, _ in parts.result(qid)] == want == [o for o, _ in whole.result(qid)], (b, qid)
        assert np.array_equal(parts.state.queries.radius, whole.state.queries.radius)


def test_sjf_groups_cover_every_pair_cheapest_first():
    rng = np.random.default_rng(3)
    obj, slot = rng.integers(0, 50, 400), rng.integers(0, 30, 400)
    got = list(sjf_groups(obj, slot, 53, 7))
    assert len(got) == 8 and sorted(np.concatenate([g.objects for g in got]).tolist()) == list(range(53))
    work = np.concatenate([g.workload for g in got])
    assert (np.diff(work) >= 0).all() and work.tolist() == np.bincount(obj, minlength=53)[
        np.concatenate([g.objects for g in got])].tolist()
    pairs = sorted(zip(np.concatenate([g.obj for g in got]).tolist(), np.concatenate([g.slot for g in got]).tolist()))
    assert pairs == sorted(zip(obj.tolist(), slot.tolist()))
    for g in got:
        assert set(g.obj.tolist()) <= set(g.objects.tolist())


class _DiesAfter(Exception):
    pass


def test_a_worker_lost_between_parts_is_rebuilt_from_redis_and_the_remaining_rows(redis_url, namespace,
                                                                                  places_slice, monkeypatch):
    """Real places: worker A releases a batch in parts and dies after writing two of them (its
    third script call fails); Redis's marker names the half-written batch and the rows it holds.
    A new worker rebuilt from Redis (as a revival does) and given only the other rows ends with
    the oracle's kNN, in its memory and in Redis; its parts and a re-sent part change nothing twice."""
    keys, c = Keys(namespace), connect(redis_url)
    objs = read_objects(str(places_slice), ["id", "lon", "lat", "t", "keywords"]).slice(0, 3000)
    initial, stream = objs.slice(0, 1500), objs.slice(1500, 600)
    rng = np.random.default_rng(7)
    at = rng.choice(initial.num_rows, 40, replace=False)
    vocab = sorted({w for ws in initial.column("keywords").to_pylist() for w in ws})
    qs = [Query(f"q{i}", float(initial.column("lon")[int(j)].as_py()), float(initial.column("lat")[int(j)].as_py()),
                tuple(initial.column("keywords")[int(j)].as_py()[:1] or [vocab[0]]), int(rng.integers(1, 6)))
          for i, j in enumerate(at.tolist())]
    cols = QueryColumns.of(qs)
    oracle = BruteForceKnn(initial)
    topk = [oracle.knn(q.lon, q.lat, list(q.keywords), q.k) for q in qs]
    details = {o for t in topk for o, _ in t}
    ids = initial.column("id").to_pylist()
    info = {o: ObjectInfo(float(initial.column("lon")[i].as_py()), float(initial.column("lat")[i].as_py()),
                          int(initial.column("t")[i].as_py()), initial.column("keywords")[i].as_py())
            for i, o in enumerate(ids) if o in details}
    a = KnnWorker(0, WorkerSettings(redis_url, namespace, index="rtree", release_groups=8))
    a.load_queries(cols, topk, info)
    calls = {"n": 0}
    apply = a.state.writer.apply

    def dies_on_third(tag, payload):
        calls["n"] += 1
        if calls["n"] == 3:
            raise _DiesAfter(tag)
        return apply(tag, payload)

    monkeypatch.setattr(a.state.writer, "apply", dies_on_third)
    with pytest.raises(_DiesAfter):
        a.process_batch(5, *_args(stream))
    last, partial = applied_state(c, keys, 0)
    assert last == 4 and partial is not None and partial[0] == 5
    held = partial[1]
    assert 0 < len(held) < stream.num_rows
    assert rows_to_resend(4, np.arange(600), last, partial) is None
    assert rows_to_resend(6, np.arange(600), last, partial).tolist() == list(range(600))
    rest = rows_to_resend(5, np.arange(600), last, partial)
    assert sorted(np.concatenate([rest, held]).tolist()) == list(range(600))
    # The revival: queries and results as Redis holds them, then the rest of the batch.
    b = KnnWorker(0, WorkerSettings(redis_url, namespace, index="rtree", release_groups=8))
    got = [[(o, float(d)) for o, d in c.zrange(keys.result(q.id), 0, -1, withscores=True)] for q in qs]
    b.load_queries(QueryColumns.of([Query.from_hash(q.id, c.hgetall(keys.query(q.id))) for q in qs]), got, {},
                   write=False)
    b.process_batch(5, *_args(stream.take(pa.array(rest))), rows=rest)
    assert applied_state(c, keys, 0) == (5, None)
    final = BruteForceKnn(pa.concat_tables([initial, stream]))
    for q in qs:
        want = [o for o, _ in final.knn(q.lon, q.lat, list(q.keywords), q.k)]
        assert [o for o, _ in b.result(q.id)] == want, q.id
        assert sorted(c.zrange(keys.result(q.id), 0, -1)) == sorted(want), q.id


def test_a_batch_report_takes_each_object_s_last_release():
    from knnmon.coordinator.runtime.metrics import BatchReport
    from knnmon.reports import WorkerReport

    a = WorkerReport(worker=0, batch=3, released=(np.array([0, 2, 3]), np.array([10.0, 30.0, 5.0])))
    b = WorkerReport(worker=1, batch=3, released=(np.array([3, 2]), np.array([7.0, 20.0])))
    report = BatchReport.of(3, 5, 0, 5, 2, 1.0, 0.1, 0.1, [a, b])
    assert np.array_equal(report.released_ms, [10.0, np.nan, 30.0, 7.0, np.nan], equal_nan=True)
    assert BatchReport.of(3, 5, 0, 5, 2, 1.0, 0.1, 0.1, [WorkerReport(worker=0, batch=3)]).released_ms is None
