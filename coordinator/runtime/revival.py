"""Bringing a lost worker back in the middle of a run, exactly.

When a worker's Ray actor dies (:class:`~knnmon.errors.WorkerLostError`), :func:`revive` starts
a new one and rebuilds it from what Redis holds, while the other workers keep their state:

1. its queries (the coordinator knows which) with their parameters and version from their hashes
   and their results from their sorted sets: Redis holds each result exactly as of the last
   batch this worker's script applied (a script is atomic);
2. that batch's number, from the worker's idempotency marker (``knn:worker:{w}:batch``,
   ``<session>:<batch>``);
3. the batches dispatched but not yet collected are sent again to the new worker, those after
   that number only (the earlier ones it applied already; a collected batch was written). A
   batch between the marker and the uncollected ones changed nothing of this worker's results,
   so nothing is lost by not sending it again.

The revived worker's reports of batches it had applied before dying are lost (empty reports).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace


from knnmon.batch import WorkerReport
from knnmon.connection import connect, with_retries
from knnmon.coordinator.runtime.dispatch import DispatchedBatch
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.runtime.worker_pool import Pending, RayPool
from knnmon.errors import WorkerLostError
from knnmon.keys import Keys
from knnmon.query import Query, QueryColumns

__all__ = ["last_applied_batch", "revive"]

log = logging.getLogger("knnmon.runtime")


def _marker_batch(marker: str | None) -> int:
    try:
        return max(int((marker or "").rsplit(":", 1)[1]), -1)
    except (IndexError, ValueError):
        return -1


def last_applied_batch(client, keys: Keys, worker: int) -> int:
    """The number of the last batch worker ``worker``'s script applied (``-1``: none; its
    registrations use negative tags). In a Redis Cluster, every master's marker must agree.

    Raises
    ------
    WorkerLostError
        In a cluster, the worker's last batch reached some masters only (it died between its
        calls): Redis holds part of a batch, so the worker cannot be rebuilt from it in place.
    """
    from redis.cluster import RedisCluster

    if not isinstance(client, RedisCluster):
        return _marker_batch(client.get(keys.worker_batch(worker)))
    from knnmon.redis_cluster import MasterMap

    masters = MasterMap(client)
    found = {_marker_batch(client.get(keys.worker_batch(worker, masters.tag_of(n)))) for n in masters.names}
    if len(found) > 1:
        raise WorkerLostError(worker, f"its last write reached some masters of the Redis Cluster only (batches "
                                      f"{sorted(found)}); it cannot be revived in place")
    return found.pop()


def revive(pool: RayPool, registrar: Registrar, redis_url: str, namespace: str, worker: int,
           uncollected: Sequence[DispatchedBatch], chunk: int = 10_000) -> list[DispatchedBatch]:
    """Start worker ``worker`` anew and rebuild it exactly (module docstring); returns
    ``uncollected`` with this worker's calls sent to the new worker. The new worker gets the
    routing table's keyword codes as they are now (queries registered since the start added some),
    so that the batches' pre-encoded keywords mean the same to it.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable.
    """
    t0 = time.perf_counter()
    keys = Keys(namespace)
    client = connect(redis_url)
    try:
        qids = [q for q, w in registrar.query_worker.items() if w == worker]
        queries, topk = [], []
        for s in range(0, len(qids), chunk):
            part = qids[s:s + chunk]

            def read(part=part):
                pipe = client.pipeline(transaction=False)
                for qid in part:
                    pipe.hgetall(keys.query(qid))
                    pipe.zrange(keys.result(qid), 0, -1, withscores=True)
                return pipe.execute()

            got = with_retries(read, f"reading worker {worker}'s queries", redis_url)
            for qid, h, result in zip(part, got[0::2], got[1::2]):
                queries.append(Query.from_hash(qid, h))
                topk.append([(o, float(d)) for o, d in result])
        last = with_retries(lambda: last_applied_batch(client, keys, worker), "reading a worker's marker", redis_url)
    finally:
        client.close()
    routing = registrar.plan.routing
    pool.replace(worker, vocabulary={w: i for i, w in enumerate(routing.vocabulary)})
    pool.gather([pool.call(worker, "load_queries", QueryColumns.of(queries), topk, {}, write=False)])
    out, resent = [], 0
    for d in uncollected:
        if worker not in d.rows:
            out.append(d)
            continue
        if d.number > last:
            call = pool.call(worker, "process_rows", d.shared, d.rows[worker])
            resent += 1
        else:  # applied before the worker died; its report is lost
            call = Pending(worker, pool.share(WorkerReport(worker=worker, batch=d.number)))
        out.append(replace(d, pending=[call if p.worker == worker else p for p in d.pending]))
    log.warning("worker %d revived: %d queries rebuilt from Redis as of batch %d, %d batches sent again, in %.1f s",
                worker, len(queries), last, resent, time.perf_counter() - t0)
    return out
