"""Keeping the workers as they are: a service's restart without loading any worker.

On a Ray cluster that outlives the service, the workers are detached actors
(:mod:`knnmon.workers.actor`) that a restarted service takes (``RayPool(detach_as=...)``). When
Redis allows a start from the stored results (:mod:`~knnmon.coordinator.recovery.resume`) and
every taken worker's state equals what Redis holds for its queries
(:mod:`knnmon.workers.kept_state`: Redis's marker is the value of the worker's own last write, no
write failed since, nothing is handed over), the service keeps them: instead of reading
every stored result and loading it (:mod:`~knnmon.coordinator.recovery.stored_start`), it asks
each worker for its queries, their kNN radii and its keyword codes, and

1. **plans** as a start from the stored results does (every query stays where it is, the coarse
   routing table, the background build of the regions' table), with the workers' own keyword
   codes: the routing table's vocabulary is theirs (codes no worker holds any more keep a
   placeholder no keyword equals), so batches stay encoded as the workers read them;
2. **replays** the objects delivered but not acknowledged as
   :meth:`~knnmon.coordinator.recovery.stored_start.StoredWorkers.replay` does, each worker getting
   those its lists (within ``k`` or in the reserve) do not hold, asked of the worker itself. A
   worker that applied the last batch holds its objects that entered; the others did not enter
   and a kNN radius only grows through a refill, which sees them; a worker that did not apply it
   gets them all. Each result is then the exact kNN over every object delivered.

A kept worker's writes carry a new session (:meth:`~knnmon.workers.kept_state.KeptState.keep_for`),
so no batch number of this service matches a marker written before. If anything above does not
hold, the taken workers are reset and loaded from Redis as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from knnmon.assignment.routing import RoutingTable
from knnmon.coordinator.live_routing import LiveRouting
from knnmon.coordinator.recovery.stored_start import StoredStart, StoredWorkers
from knnmon.keys import Keys
from knnmon.query import Query, QueryColumns
from knnmon.workers.placements import placement_number

if TYPE_CHECKING:
    from knnmon.coordinator.planning import PlanResult
    from knnmon.coordinator.runtime.worker_pool import WorkerPool

__all__ = ["KeptStart", "KeptWorkers", "PLACEHOLDER", "kept_start"]

log = logging.getLogger("knnmon.runtime")

#: The routing vocabulary's entry for a code no kept worker holds (a keyword is never empty,
#: never starts with a NUL).
PLACEHOLDER = "\x00unused:{}"


@dataclass
class KeptStart(StoredStart):
    """A :class:`~knnmon.coordinator.recovery.stored_start.StoredStart` whose workers are kept
    (module docstring): ``radius`` ``(m,)`` float64 meters and ``counts`` ``(m,)`` int64, each
    query's kNN radius and result size as its worker holds them; ``codes`` the workers' keyword
    codes (keyword -> code); ``seconds`` what :func:`kept_start` spent: the workers ``asked``,
    the ``columns`` joined, the ``sets`` read."""

    radius: np.ndarray = field(default_factory=lambda: np.empty(0))
    counts: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    codes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def read(self, redis_url: str, namespace: str, windowed: bool, chunk: int = 0) -> StoredWorkers:
        """Nothing to read: the workers hold it (the objects stream's length, for the plan)."""
        from knnmon.connection import connect

        client = connect(redis_url)
        try:
            entries = client.xlen(Keys(namespace).ingest_objects)
        finally:
            client.close()
        return KeptWorkers(self, None, {}, windowed, entries)

    def plan(self, model, config, radius: np.ndarray, counts: np.ndarray, objects: int, redis_url: str,
             namespace: str) -> PlanResult:
        """:meth:`StoredStart.plan`, its routing table in the workers' codes (module docstring)."""
        result = super().plan(model, config, radius, counts, objects, redis_url, namespace)
        coarse = result.routing.table if result.workload is not None else RoutingTable(  # (no queries: no keywords)
            model.grid, [], np.zeros(0, np.uint64), np.empty(0, np.int64), np.empty(0, np.uint64))
        result.routing = LiveRouting(_in_codes(coarse, self.codes))
        return result

    def results_of(self, stored: StoredWorkers) -> tuple[np.ndarray, np.ndarray]:
        return self.radius, self.counts


def _in_codes(routing: RoutingTable, codes: dict[str, int]) -> RoutingTable:
    """``routing`` (cells-free, :func:`~knnmon.coordinator.recovery.stored_start.coarse_routing`)
    with its keywords at the codes ``codes`` gives them.

    Raises
    ------
    KeyError
        A keyword of ``routing`` without a code in ``codes``.
    """
    size = max(codes.values(), default=-1) + 1
    vocabulary = [PLACEHOLDER.format(c) for c in range(size)]
    for word, c in codes.items():
        vocabulary[c] = word
    always = np.zeros(size, dtype=np.uint64)
    at = np.asarray([codes[w] for w in routing.vocabulary], dtype=np.int64)
    np.bitwise_or.at(always, at, routing.always[:len(at)])
    return RoutingTable(routing.grid, vocabulary, always, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64))


@dataclass
class KeptWorkers(StoredWorkers):
    """:class:`StoredWorkers` for kept workers: nothing to load (each one only takes a new
    session, :meth:`send`), and each one says which of the replayed objects it holds."""

    kept: int = 0

    def send(self, pool, routing: LiveRouting, chunk: int = 0) -> list:
        self.kept = pool.size
        pool.kept = {}
        return [pool.keep_for(w) for w in range(pool.size)]

    def holds(self, pool, ids: list[str]) -> dict[int, set[str]]:
        return {w: set(h) for w, h in enumerate(pool.gather([pool.holds_among(w, ids) for w in range(pool.size)]))}


def kept_start(pool: WorkerPool, client, keys: Keys, workers: int, log_of_objects: Any, number: int
               ) -> tuple[KeptStart | None, str | None]:
    """The :class:`KeptStart` of the workers ``pool`` took (``pool.kept``), with the objects
    stream's log (or its future) ``log_of_objects`` and the replay at batch ``number``; or
    ``None`` and why they cannot be kept. Reads each worker's marker and the ``queries`` set's
    size from Redis (``client``), each worker's queries from the worker."""
    if sorted(pool.kept) != list(range(workers)):
        return None, f"{len(pool.kept)} of {workers} workers were taken from the service before"
    for w in range(workers):
        state = pool.kept[w]
        if state.why is not None:
            return None, f"worker {w}: {state.why}"
        if state.marker is None or client.get(keys.worker_batch(w)) != state.marker:
            return None, f"worker {w}: Redis's marker is not its last write"
    t0 = time.perf_counter()
    got = pool.gather([pool.kept_queries(w) for w in range(workers)])
    t1 = time.perf_counter()
    codes: dict[str, int] = {}
    for _, _, _, theirs in got:
        for word, c in theirs.items():
            if codes.setdefault(word, c) != c:
                return None, f"two workers code keyword {word[:32]!r} differently"
    if len(set(codes.values())) != len(codes) or any(c < 0 for c in codes.values()):
        return None, "two keywords share a code"
    ids = [x for q, _, _, _ in got for x in q.ids]
    registered = client.scard(keys.queries)
    if registered != len(ids) or len(set(ids)) != len(ids):
        return None, f"Redis registers {registered} queries, the workers hold {len(ids)}"
    worker = np.concatenate([np.full(len(q), w, dtype=np.int32) for w, (q, _, _, _) in enumerate(got)])
    columns = QueryColumns(ids, np.concatenate([np.asarray(q.lon, np.float64) for q, _, _, _ in got]),
                           np.concatenate([np.asarray(q.lat, np.float64) for q, _, _, _ in got]),
                           [tuple(kw) for q, _, _, _ in got for kw in q.keywords],
                           np.concatenate([np.asarray(q.k, np.int64) for q, _, _, _ in got]))
    t2 = time.perf_counter()
    set_of = _sets(client, keys, ids)
    return KeptStart(columns, worker, set_of, log_of_objects, number,
                     radius=np.concatenate([r for _, r, _, _ in got]),
                     counts=np.concatenate([c for _, _, c, _ in got]), codes=codes,
                     seconds={"asked": t1 - t0, "columns": t2 - t1, "sets": time.perf_counter() - t2}), None


def queries_of(start: KeptStart) -> list[Query]:
    """The kept queries as :class:`~knnmon.query.Query` objects (equal to those read from their
    hashes: the same fields)."""
    q = start.queries
    return [Query(i, float(x), float(y), tuple(kw), int(k))
            for i, x, y, kw, k in zip(q.ids, q.lon.tolist(), q.lat.tolist(), q.keywords, q.k.tolist())]


#: Each key's ``set`` field (``nil``: none), in one round trip per chunk (a kept start runs on
#: one Redis server: :func:`~knnmon.coordinator.recovery.resume.why_not_resumable`).
_SETS = "local out = {} for i, key in ipairs(KEYS) do out[i] = redis.call('HGET', key, 'set') end return out"


def _sets(client, keys: Keys, ids: list[str], chunk: int = 10_000) -> np.ndarray:
    """``(m,)`` int32: each query's set as its hash records it (``-1``: none, or not a number
    below 2**31: :func:`~knnmon.workers.placements.placement_number`)."""
    out = np.full(len(ids), -1, dtype=np.int32)
    for s in range(0, len(ids), chunk):
        part = [keys.query(qid) for qid in ids[s:s + chunk]]
        for j, v in enumerate(client.eval(_SETS, len(part), *part)):
            n = placement_number(v)
            out[s + j] = n if n is not None and n < 2 ** 31 else -1
    return out
