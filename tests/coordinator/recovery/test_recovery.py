"""Recovery's reconcile: the stored results that differ from the exact kNN (a batch cut short by
the stop) are found and repaired, and only those, on real places."""

from __future__ import annotations

import pyarrow.parquet as pq
import redis

from knnmon.assignment import LoadModel
from knnmon.coordinator.runtime.preparation import prepare_tables
from knnmon.coordinator.recovery.object_log import OBJECT_SCHEMA
from knnmon.coordinator.recovery.rebuild import reconcile
from knnmon.feed import parse_entry
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys


def test_reconcile_repairs_exactly_the_results_that_differ(places_slice, slice_queries, redis_url, namespace):
    objects = stream_order(read_objects(str(places_slice)), None).select(OBJECT_SCHEMA.names).cast(OBJECT_SCHEMA)
    queries = pq.read_table(slice_queries).slice(0, 3000)
    prepared = prepare_tables(LoadModel.uniform(), queries, objects, OBJECT_SCHEMA.empty_table(), processes=1,
                              reserve=2)
    prepared.first_batch = 7
    r, keys = redis.Redis.from_url(redis_url, decode_responses=True), Keys(namespace)
    qids, k = queries.column("id").to_pylist(), queries.column("k").to_pylist()
    exact = {qid: prepared.knn(i)[:k[i]] for i, qid in enumerate(qids)}  # (the reserve is not stored)
    pipe = r.pipeline(transaction=False)
    for qid, knn in exact.items():
        if knn:
            pipe.zadd(keys.result(qid), dict(knn))
    pipe.execute()
    full = [q for q in qids if len(exact[q]) >= 2]
    a, b, c, d = full[0], full[10], full[20], full[30]
    r.delete(keys.result(a))  # none written
    r.zrem(keys.result(b), exact[b][-1][0])  # one neighbour in place of another
    r.zadd(keys.result(b), {"stale-neighbour": exact[b][-1][1]})
    r.zadd(keys.result(c), {"not-a-neighbour": 0.5})  # one too many
    r.zrem(keys.result(d), exact[d][-1][0])  # one missing
    assert reconcile(redis_url, namespace, r, prepared, chunk=1000) == 4
    for qid in qids:
        assert [(o, float(s)) for o, s in r.zrange(keys.result(qid), 0, -1, withscores=True)] == exact[qid], qid
    lines = [x for _, f in r.xrange(keys.changes) for x in parse_entry(f)]
    assert sorted(x[0] for x in lines) == sorted([a, b, c, d]) and {x[3] for x in lines} == {7}
    left = {x[0]: x[2] for x in lines}
    assert left[c] == ["not-a-neighbour"] and left[b] == ["stale-neighbour"] and left[a] == left[d] == []
    assert reconcile(redis_url, namespace, r, prepared, chunk=1000) == 0
