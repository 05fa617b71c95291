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

The queries are read :data:`CHUNK` at a time (one script call each), and each chunk is loaded
into the new worker while the next is read, so the load costs little beyond the read.

The revived worker's reports of batches it had applied before dying are lost (empty reports).

**With a window** Redis holds each result's first ``k`` but not the reserve beyond it. Between
batches (a loss found by a registration, an unregister, the worker list, or the next batch's
expiry, before the batch is sent) Redis holds exactly what the worker applied: each list is
loaded as its result, ``r_q`` its ``k``-th distance, with the members' times from the worker's
details hash, and the reserve comes back with the query's next refill -- no search. A batch
in flight (one) that the worker had not written is then replayed on top: its expiry, the
refills that expiry needs searched over the live objects but the batch's own (the store holds
them already; ``refill``), and every object of the batch. Only where that cannot be (several
batches in flight, a member's details missing) is the worker rebuilt instead over the
coordinator's live objects, which already hold every batch dispatched (each
query's exact ``k + reserve`` nearest live matches, as a registration's are searched); the
rebuilt lists' regions join the routing table (a list whose reserve had run out may reach
farther now); Redis is made to hold the rebuilt results, whatever part of the batch in flight the
worker had written (:func:`~knnmon.coordinator.recovery.revival_repair.repair_worker`: one atomic
write at that batch's feed version); the batch's call to the worker then reports nothing (its
work is in the rebuilt state).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from knnmon.batch import KnnColumns, ObjectColumns
from knnmon.connection import connect, with_retries
from knnmon.coordinator.runtime.dispatch import DispatchedBatch
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.recovery.revival_repair import Repair, read_details, repair_worker
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import WorkerLostError
from knnmon.keys import Keys
from knnmon.query import QueryColumns
from knnmon.refills import Refills
from knnmon.reports import WorkerReport
from knnmon.results import ResultReader, StoredLists

__all__ = ["Revival", "held_details", "last_applied_batch", "revive"]

log = logging.getLogger("knnmon.runtime")

#: Queries read from Redis per script call in a revival, and loaded into the new worker while
#: the next chunk is read.
CHUNK = 10_000


def _marker_batch(marker: str | None) -> int:
    """A marker's batch: ``<session>:<batch>`` (``-1``: none yet, or unreadable)."""
    try:
        return max(int((marker or "").rsplit(":", 1)[1]), -1)
    except (IndexError, ValueError):
        return -1


def last_applied_batch(client, keys: Keys, worker: int) -> int:
    """The number of the last batch worker ``worker``'s scripts applied (``-1``: none; its
    registrations use negative tags). In a Redis Cluster every master's marker must agree.

    Raises
    ------
    WorkerLostError
        In a cluster, the worker's last write reached some masters only (it died between its
        calls): Redis holds part of a write, so the worker cannot be rebuilt from it in place.
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


def held_details(hashes: Mapping[str, Mapping[str, str]], ids: Sequence[str]) -> ObjectColumns | None:
    """The details of the objects ``ids`` (the members of a worker's results) from its details
    hashes (:func:`~knnmon.coordinator.recovery.revival_repair.read_details`: they hold exactly
    those members), in columns; ``None`` if one is missing or unreadable."""
    texts = {oid: text for h in hashes.values() for oid, text in h.items()}
    wanted = list(dict.fromkeys(ids))
    try:
        return ObjectColumns.of_texts(wanted, [texts[oid] for oid in wanted])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Revival:
    """What :func:`revive` did.

    Attributes
    ----------
    batches
        The uncollected batches, this worker's calls sent to the new worker.
    absent
        Query ids it was asked to hold that Redis has no hash of (a registration the worker
        died before writing): not loaded; the caller sends them again.
    repair
        With a window, what Redis needed to hold the rebuilt results
        (:func:`~knnmon.coordinator.recovery.revival_repair.repair_worker`).
    seconds
        Its steps' wall time: ``details`` (with a window: the members' details from Redis),
        ``read`` (queries and results from Redis, a chunk at a time, each chunk loaded into the
        new worker while the next is read), ``search`` (with a window, where the lists are
        rebuilt: over the live objects, their regions routed), ``repair``, ``load`` (the new
        worker's load beyond the read), ``total``.
    """

    batches: list[DispatchedBatch]
    absent: list[str]
    repair: Repair = Repair()
    seconds: dict[str, float] = field(default_factory=dict)


def revive(pool: WorkerPool, registrar: Registrar, redis_url: str, namespace: str, worker: int,
           uncollected: Sequence[DispatchedBatch], chunk: int | None = None, *, also: Sequence[str] = (),
           live: ObjectStore | None = None, version: int = 0,
           refill: Callable[[int, QueryColumns, frozenset[str]], Refills | None] | None = None) -> Revival:
    """Start worker ``worker`` anew and rebuild it exactly (module docstring): its queries (the
    registrar's, and ``also``: ids no longer registered whose keys it may not have deleted yet)
    as Redis holds them; returns ``uncollected`` with this worker's calls sent to the new worker,
    and the ids that Redis holds no hash of. The new worker gets the routing table's keyword
    codes as they are now (queries registered since the start added some), so that the batches'
    pre-encoded keywords mean the same to it.

    With a window (``live``: the live objects, every batch of ``uncollected`` dispatched into
    them already) and no batch in flight, or one that ``refill`` (worker, its refill needs, ids
    to leave out -> its :class:`Refills`) lets it replay, each list is its result as Redis holds
    it (module docstring), unless the details hash lacks a member's details; else ``live`` gives each
    query's exact ``k + reserve`` nearest, Redis is repaired to their first ``k`` at feed version
    ``version`` (the newest dispatched batch's number plus one, or the next batch's number when
    none is in flight), and the worker's calls of ``uncollected`` report nothing.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable.
    """
    t0 = time.perf_counter()
    chunk = chunk or CHUNK
    pool.replace(worker)  # the new process starts while its state is read
    keys = Keys(namespace)
    client = connect(redis_url)
    routing = registrar.plan.routing
    seconds: dict[str, float] = {}

    def codes(q: QueryColumns) -> dict[str, int]:  # (the new worker's codes of their keywords)
        return {x: routing.code(x) for kws in q.keywords for x in kws}

    try:
        qids = [q for q, w in registrar.query_worker.items() if w == worker] + list(also)
        try:
            last = with_retries(lambda: last_applied_batch(client, keys, worker), "reading a worker's marker",
                                redis_url)
        except WorkerLostError:
            if live is None:
                raise
            last = None  # (a window rebuilds over the live objects)
        # With a window: from Redis with the members' details when it holds them, and a batch in
        # flight (one) replayed on top of what the worker wrote.
        first_k = live is not None and (not uncollected or (refill is not None and len(uncollected) == 1
                                                            and last is not None and uncollected[0].cutoff is not None))
        hashes = None  # the worker's details hashes, once read
        if first_k:
            t1 = time.perf_counter()
            hashes = read_details(redis_url, namespace, worker)
            seconds["details"] = time.perf_counter() - t1
        # Read chunk by chunk, each loaded while the next is read (from Redis as it holds them),
        # until a chunk's members lack details (a window's lists are then rebuilt over the live objects).
        streaming = live is None or first_k
        reader = ResultReader(client, keys, url=redis_url, chunk=chunk)
        parts, loads = [], []
        for s in range(0, max(len(qids), 1), chunk):
            part = reader.lists(qids[s:s + chunk])
            parts.append(part)
            details: Any = {}
            if streaming and first_k:
                details = held_details(hashes, part.members)
                streaming = details is not None
            if streaming:
                loads.append(pool.load(worker, part.queries, KnnColumns(part.counts, part.members, part.dist),
                                       details, write=False, vocabulary=codes(part.queries), first_k=first_k,
                                       rebuild=s + chunk >= len(qids)))
    finally:
        client.close()
    stored = StoredLists.concat(parts)
    queries, absent = stored.queries, stored.absent
    seconds["read"] = time.perf_counter() - t0 - seconds.get("details", 0.0)
    repair = Repair()
    replay = first_k and streaming and bool(uncollected)
    if streaming:
        live = None
    else:  # the lists with their reserves over the live objects, Redis made to hold their first k
        first_k = False
        if loads:  # (chunks loaded before one lacked its details: a new worker again)
            pool.replace(worker)
        lon, lat, k = queries.lon, queries.lat, queries.k
        cap = k + registrar.reserve
        t1 = time.perf_counter()
        topk, details = live.knn_v(lon, lat, list(queries.keywords), cap)
        rect = registrar.plan.model.rects(lon, lat, topk.kth(cap))
        routing.add_many([[routing.code(x) for x in kws] for kws in queries.keywords], rect.x0, rect.y0, rect.x1,
                         rect.y1, np.full(len(queries), worker))
        t2 = time.perf_counter()
        repair = repair_worker(redis_url, namespace, worker, list(queries.ids), stored.results(), topk, k, details,
                               version=version, tag=version - 1, held=hashes)
        seconds.update(search=t2 - t1, repair=time.perf_counter() - t2)
        loads = [pool.load(worker, queries, topk, details, write=False, vocabulary=codes(queries))]
    t3 = time.perf_counter()
    pool.gather(loads)
    seconds.update(load=time.perf_counter() - t3, total=time.perf_counter() - t0)
    out, resent = [], 0
    for d in uncollected:
        if worker not in d.rows:
            out.append(d)
            continue
        if replay and d.number > last:  # the worker wrote none of it: its expiry, refills and objects again
            needs = pool.gather([pool.expire(worker, d.cutoff)])[0]
            refills = refill(worker, needs, d.ids)
            # Every object of the batch: it was routed before these refills widened some regions
            # (the worker's own query index finds which objects each query needs).
            call = pool.process(worker, d.shared, np.arange(d.objects, dtype=np.int64), cutoff=d.cutoff,
                                refills=refills)
            resent += 1
            out.append(replace(d, pending=[call if p.worker == worker else p for p in d.pending]))
            continue
        rows = None if live is not None or replay or d.number <= last else d.rows[worker]
        if rows is not None:
            call = pool.process(worker, d.shared, rows)
            resent += 1
        else:  # applied before the worker died (or, with a window, in the rebuilt lists); its report is lost
            call = Pending(worker, pool.share(WorkerReport(worker=worker, batch=d.number)))
        out.append(replace(d, pending=[call if p.worker == worker else p for p in d.pending]))
    how = ("over the live objects" if live is not None else "from Redis with their details" if first_k else
           f"from Redis as of batch {last}")
    log.warning("worker %d revived: %d queries rebuilt %s, %d batches sent again, %d results repaired, in %.1f s "
                "(%s)", worker, len(queries), how, resent,
                repair.results, time.perf_counter() - t0, ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()))
    return Revival(out, absent, repair, seconds)
