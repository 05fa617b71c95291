"""The distributed runtime: plan, start workers, load the initial kNN, stream object batches.

:class:`Runtime` is what ``knnmon run`` and ``knnmon demo`` drive:

1. read objects in stream order ``(t, id)`` (or shuffled), the first ``initial`` of them seen
   before the stream starts, and the queries;
2. exact initial kNN of every query over those objects (:class:`ObjectIndex`), whose k-th
   distances are the radii the plan (:func:`plan_workload`) balances;
3. start ``W`` workers (Ray actors, or in-process objects with ``executor="inline"``) and hand
   each its queries with their initial kNN; the workers write them to Redis;
4. stream the rest in batches: drop ids seen before (counted), encode keywords, send each
   object only to the workers the routing table names, wait for all, and measure the **update
   time** (dispatch to all workers done, ms), each worker's busy time (its CPU time plus the
   Redis server's time on its writes: the time it would take on a core of its own), and the
   **load imbalance** (busiest minus idlest worker, ms);
5. register and unregister queries at run time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from knnmon.assignment.routing import MAX_ENTRIES, check_max_entries
from knnmon.connection import connect, redis_url_from_env, with_retries
from knnmon.coordinator.object_store import ObjectStore
from knnmon.coordinator.plan import PlanResult, empty_plan, load_queries, plan_workload, stream_order
from knnmon.errors import InvalidArgumentError, InvalidQueryError
from knnmon.ingest.keywords import normalize_keywords
from knnmon.ingest.queries import read_objects
from knnmon.keys import DEFAULT_NAMESPACE, Keys
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.object_index import ObjectIndex
from knnmon.workers.worker import INDEXES

__all__ = ["Prepared", "RunConfig", "Runtime", "init_ray", "prepare", "prepare_tables", "stream_order"]

log = logging.getLogger("knnmon.runtime")

#: CPUs each worker actor reserves: a token share (1,000 workers per core), only so that Ray
#: honours its soft node affinity (an actor that reserves nothing is placed on a random node).
WORKER_CPUS = 0.001


@dataclass(frozen=True)
class RunConfig:
    """Parameters of a run (the ``knnmon run`` flags).

    Raises
    ------
    InvalidArgumentError
        ``workers`` outside 1..64, ``batch < 1``, ``initial < 0``, ``batches < 1``,
        ``in_flight < 1``, an unknown ``executor`` or ``index`` (the worker's query index,
        :data:`knnmon.workers.worker.INDEXES`).

    ``in_flight`` is how many batches :meth:`Runtime.run` keeps dispatched but not yet collected:
    with 2, the coordinator routes batch ``b + 1`` while the workers and Redis still work on
    ``b``. Each worker (a Ray actor) runs its batches in the order sent, so results stay exact;
    a batch's update time then includes its wait behind the previous one.

    ``overlap_writes``: each worker writes a batch's changes to Redis on a background thread
    (:class:`~knnmon.workers.write_queue.WriteQueue`) and computes the next batch meanwhile;
    :meth:`Runtime.collect` still waits for the write before the batch counts as done. It helps
    only with ``in_flight >= 2`` (something to compute while Redis writes).
    """

    workers: int = 4
    algorithm: str = "proposed"
    initial: int = 1_000_000
    batch: int = 1000
    batches: int | None = None
    shuffle: int | None = None
    redis_url: str | None = None
    data_dir: str = "knnmon-data"
    namespace: str = DEFAULT_NAMESPACE
    ray_address: str | None = None
    executor: str = "ray"
    beta: int = 100_000
    sets_per_worker: int = 8
    delivery_cost: float | None = None
    cost_model: str = "measured"
    processes: int = 2
    seed: int = 0
    index: str = "grid"
    in_flight: int = 2
    routing_entries: int = MAX_ENTRIES
    overlap_writes: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 64:
            raise InvalidArgumentError(f"--workers must be between 1 and 64; got {self.workers}")
        if self.batch < 1:
            raise InvalidArgumentError(f"--batch must be >= 1; got {self.batch}")
        if self.initial < 0:
            raise InvalidArgumentError(f"--initial must be >= 0; got {self.initial}")
        if self.batches is not None and self.batches < 1:
            raise InvalidArgumentError(f"--batches must be >= 1; got {self.batches}")
        check_max_entries(self.routing_entries)
        if self.index not in INDEXES:
            raise InvalidArgumentError(f"Invalid index: {self.index!r}.\nValid options are: {tuple(INDEXES)}")
        if self.executor not in ("ray", "inline"):
            raise InvalidArgumentError(f"Invalid executor: {self.executor!r}.\nValid options are: ('ray', 'inline')")
        if self.in_flight < 1:
            raise InvalidArgumentError(f"--in-flight must be >= 1; got {self.in_flight}")


@dataclass
class Prepared:
    """What every run over the same objects, queries and split shares (:func:`prepare`).

    ``initial`` and ``stream`` are tables in stream order; ``idx``, ``counts``, ``dist`` are the
    initial kNN as :meth:`ObjectIndex.knn_v` returns it (rows into ``initial``, per-query counts,
    meters), ``radius`` each query's k-th distance (``inf`` below ``k`` matches), ``timings``
    seconds spent reading and searching; ``versions`` ``(m,)`` int64 the queries' change counts
    when a service resumes them (else ``None``: all 0).
    """

    model: Any
    queries: pa.Table
    initial: pa.Table
    stream: pa.Table
    index: ObjectIndex | None
    idx: np.ndarray
    counts: np.ndarray
    dist: np.ndarray
    radius: np.ndarray
    timings: dict[str, float]
    versions: np.ndarray | None = None


def prepare(objects_dir: str, queries: str | pa.Table, config: RunConfig) -> Prepared:
    """Read the objects in stream order, split initial/stream, and compute the exact initial kNN.

    Raises
    ------
    InvalidArgumentError
        A missing or invalid ingest directory or query file.
    """
    from knnmon.assignment import LoadModel

    c = config
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model = LoadModel.from_ingest(objects_dir)
    queries = queries if isinstance(queries, pa.Table) else load_queries(queries)
    objects = stream_order(read_objects(objects_dir, ["id", "lon", "lat", "t", "keywords"]), c.shuffle)
    initial = objects.slice(0, min(c.initial, objects.num_rows))
    rest = objects.slice(initial.num_rows)
    if c.batches is not None:
        rest = rest.slice(0, c.batches * c.batch)
    timings["read_s"] = time.perf_counter() - t0

    return prepare_tables(model, queries, initial, rest, processes=c.processes, timings=timings)


def prepare_tables(model: Any, queries: pa.Table, initial: pa.Table, stream: pa.Table, *, processes: int = 2,
                   timings: dict[str, float] | None = None) -> Prepared:
    """:class:`Prepared` from tables already in memory: the exact kNN of ``queries`` (``id``,
    ``lon``, ``lat``, ``keywords``, ``k``; may be empty) over ``initial`` (``id``, ``lon``,
    ``lat``, ``t``, ``keywords``; may be empty), with ``stream`` still to come."""
    timings = dict(timings or {})
    t0 = time.perf_counter()
    index = ObjectIndex(initial) if initial.num_rows else None
    lon, lat = queries.column("lon").to_numpy(), queries.column("lat").to_numpy()
    k = queries.column("k").to_numpy().astype(np.int64)
    if index is not None and len(lon):
        idx, counts, dist = index.knn_v(lon, lat, queries.column("keywords"), k, processes=processes)
    else:
        idx, counts, dist = np.empty(0, np.int64), np.zeros(len(lon), np.int64), np.empty(0)
    ends = np.cumsum(counts)
    radius = np.full(len(lon), np.inf)
    full = counts >= k
    radius[full] = dist[ends[full] - 1]
    timings["initial_knn_s"] = time.perf_counter() - t0
    return Prepared(model, queries, initial, stream, index, idx, counts, dist, radius, timings)


def init_ray(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local instance
    (all cores, no dashboard, 512 MiB object store); returns ``True`` if it started Ray."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                 object_store_memory=512 * 1024 * 1024, log_to_driver=False)
    return True


class _Inline:
    """In-process stand-in for a Ray actor handle (``executor="inline"``)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str):
        method = getattr(self._obj, name)

        class _Remote:
            @staticmethod
            def remote(*args, **kwargs):
                return method(*args, **kwargs)

        return _Remote


class Runtime:
    """One run of knnmon (module docstring). Use as a context manager, or call :meth:`close`.

    Parameters
    ----------
    objects_dir
        An ingest output directory.
    queries
        A query file path, or a query table (``id``, ``lon``, ``lat``, ``keywords``, ``k``).
    config
        :class:`RunConfig`.
    prepared
        The stream and initial kNN from :func:`prepare` or :func:`prepare_tables`, to reuse
        across runs (benchmarks); computed by :meth:`start` when omitted.
    resume
        Redis already holds these queries and exactly these results (a service resuming,
        :mod:`knnmon.coordinator.serve`): keep the namespace, do not rewrite the results, only
        record each query's new ``worker``. Default: a run starts from an empty namespace.
    """

    def __init__(self, objects_dir: str | None, queries: str | pa.Table | None, config: RunConfig,
                 prepared: Prepared | None = None, *, resume: bool = False) -> None:
        self.config = config
        self.resume = resume
        self.prepared = prepared
        self.objects_dir = objects_dir
        self._queries_arg = queries
        self.redis: EmbeddedRedis | None = None
        self.redis_url: str | None = None
        self._ray_started = False
        self.actors: list[Any] = []
        self.plan: PlanResult | None = None
        self.store: ObjectStore | None = None
        self.seen: set[str] = set()
        self.next_batch = 0
        self.stream_table: pa.Table | None = None
        self.query_worker: dict[str, int] = {}
        self.worker_loads = np.zeros(config.workers)  # predicted, plus queries registered later
        self.worker_queries = np.zeros(config.workers, dtype=np.int64)
        self.timings: dict[str, float] = {}
        self.rows: list[dict[str, Any]] = []  # per-batch measurements of :meth:`run`

    # -- start -------------------------------------------------------------------------------
    def _start_redis(self) -> None:
        url = redis_url_from_env(self.config.redis_url)
        if url is None:
            self.redis = EmbeddedRedis(os.path.join(self.config.data_dir, "redis")).start()
            url = self.redis.url
        self.redis_url = url
        if self.resume:
            return
        client = connect(url)
        ns = self.config.namespace
        for keys in _chunks(client.scan_iter(match=f"{ns}:*", count=10_000), 10_000):
            client.unlink(*keys)  # a run starts from an empty namespace
        client.close()

    def _start_workers(self, vocabulary: dict[str, int]) -> None:
        from knnmon.workers.worker import KnnWorker

        W = self.config.workers
        if self.config.executor == "inline":
            self.actors = [_Inline(KnnWorker(w, self.redis_url, self.config.namespace, vocabulary=vocabulary,
                                             index=self.config.index, overlap_writes=self.config.overlap_writes))
                           for w in range(W)]
            return

        from knnmon.workers.actor import WorkerActor

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray_started = init_ray(self.config.ray_address)
        # Worker w goes to node w mod (alive nodes), softly (elsewhere if that node cannot take
        # it): Ray's SPREAD is best effort and was seen placing 3 workers on one of 3 nodes. The
        # actor asks for a token CPU share: Ray places an actor that asks for no resources on a
        # random node unless its node affinity is hard (ClusterResourceScheduler::
        # GetBestSchedulableNode), which put all 3 workers on one of 3 nodes in 1 of 9 runs.
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        log.info("starting %d workers on %d alive Ray nodes: %s", W, len(nodes), ", ".join(n[:8] for n in nodes))
        self.actors = [WorkerActor(num_cpus=WORKER_CPUS, scheduling_strategy=NodeAffinitySchedulingStrategy(
            nodes[w % len(nodes)], soft=True)).remote(w, self.redis_url, self.config.namespace,
                                                       vocabulary=vocabulary, index=self.config.index,
                                                       overlap_writes=self.config.overlap_writes)
                       for w in range(W)]

    def _get(self, refs):
        if self.config.executor == "inline":
            return refs
        import ray

        return ray.get(refs)

    def start(self) -> Runtime:
        """Read, plan, start Redis and the workers, load every query's initial kNN."""
        c = self.config
        p = self.prepared if self.prepared is not None else prepare(self.objects_dir, self._queries_arg, c)
        self.prepared = p
        self.timings.update(p.timings)
        model, queries, initial, index = p.model, p.queries, p.initial, p.index
        self.stream_table = p.stream
        self.store = ObjectStore(initial, index)
        lon, lat = queries.column("lon").to_numpy(), queries.column("lat").to_numpy()
        k = queries.column("k").to_numpy().astype(np.int64)
        idx, counts, dist, radius = p.idx, p.counts, p.dist, p.radius
        ends = np.cumsum(counts)
        self.seen.update(initial.column("id").to_pylist())

        t0 = time.perf_counter()
        if queries.num_rows:
            self.plan = plan_workload(model, queries, initial.select(["id", "lon", "lat", "keywords"]), radius,
                                      c.workers, c.algorithm, beta=c.beta, sets_per_worker=c.sets_per_worker,
                                      delivery_cost=c.delivery_cost, cost_model=c.cost_model, counts=counts,
                                      routing_entries=c.routing_entries,
                                      seed=c.seed)
        else:
            self.plan = empty_plan(model, c.workers, c.algorithm)
        self.worker_loads = np.array(self.plan.summary["worker_loads"], dtype=np.float64)
        self.worker_queries = np.bincount(self.plan.plan.worker, minlength=c.workers).astype(np.int64)
        self.timings["plan_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self._start_redis()
        vocabulary = {w: i for i, w in enumerate(self.plan.routing.vocabulary)}
        self._start_workers(vocabulary)
        self.timings["start_workers_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        starts = ends - counts
        ids = queries.column("id").to_pylist()
        kws = queries.column("keywords").to_pylist()
        obj_ids = index.ids if index is not None else np.empty(0, dtype=object)
        pending = []
        for w in range(c.workers):
            mine = np.flatnonzero(self.plan.plan.worker == w)
            topk = [[(obj_ids[idx[j]], float(dist[j])) for j in range(starts[q], ends[q])] for q in mine.tolist()]
            rows = np.concatenate([idx[starts[q]:ends[q]] for q in mine.tolist()] + [np.empty(0, np.int64)])
            info = self.store.initial_info(rows) if not self.resume else {}
            versions = p.versions[mine] if p.versions is not None else None
            pending.append(self.actors[w].load_queries.remote(
                [ids[q] for q in mine], lon[mine], lat[mine], k[mine], [kws[q] for q in mine], topk, info,
                versions=versions, write=not self.resume))
            for q in mine.tolist():
                self.query_worker[ids[q]] = w
        self._get(pending)
        if self.resume and self.query_worker:
            self._record_workers()
        self.timings["load_s"] = time.perf_counter() - t0
        return self

    def _record_workers(self, chunk: int = 10_000) -> None:
        """Write each query's worker into its hash (a resumed service may place it anew)."""
        keys = Keys(self.config.namespace)
        client = connect(self.redis_url)
        try:
            items = list(self.query_worker.items())
            for s in range(0, len(items), chunk):
                pipe = client.pipeline(transaction=False)
                for qid, w in items[s:s + chunk]:
                    pipe.hset(keys.query(qid), "worker", w)
                with_retries(pipe.execute, "recording the queries' workers", self.redis_url)
        finally:
            client.close()

    # -- stream ------------------------------------------------------------------------------
    def _encode(self, keywords: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        owner, codes = self.plan.routing.encode(keywords)
        keep = codes >= 0
        return owner[keep], codes[keep]

    def process(self, batch: pa.Table) -> dict[str, Any]:
        """Stream one batch of objects (columns ``id``, ``lon``, ``lat``, ``t``, ``keywords``)
        and wait for it: :meth:`collect` of :meth:`dispatch`.

        Returns
        -------
        dict
            ``batch``, ``objects``, ``duplicates``, ``update_ms``, ``route_ms``, ``busy_ms``
            (list per worker: CPU plus Redis server time, the busy time on a dedicated core),
            ``busy_wall_ms`` (call to return), ``imbalance_ms`` (of ``busy_ms``), ``sim_update_ms``
            (``route_cpu_ms``, the coordinator's CPU time routing, + the largest ``busy_ms``: the
            update time with one core per worker), ``per_worker`` (3 x W: objects delivered,
            candidates, results changed), ``deliveries``, ``candidates``, ``passed``,
            ``changed``, ``redis_server_ms`` (the Redis server's time running the workers'
            result scripts, summed: Redis is single-threaded, so this much of the batch is serial).
        """
        return self.collect(self.dispatch(batch))

    def dispatch(self, batch: pa.Table) -> dict[str, Any]:
        """Route one batch and send each worker its objects, without waiting; returns the
        pending batch for :meth:`collect`. Repeated ids are dropped here, and the batch joins the
        object store (so a query registered next starts from a kNN over it)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        ids_all = batch.column("id").to_pylist()
        fresh = []
        dup = 0
        for i, oid in enumerate(ids_all):
            if oid in self.seen:
                dup += 1
            else:
                self.seen.add(oid)
                fresh.append(i)
        if dup:
            batch = batch.take(pa.array(fresh, type=pa.int64()))
        ids = batch.column("id").to_pylist()
        lon, lat = batch.column("lon").to_numpy(), batch.column("lat").to_numpy()
        t = batch.column("t").to_numpy()
        keywords = batch.column("keywords").combine_chunks()
        pair_obj, pair_code = self._encode(keywords)
        routing = self.plan.routing
        masks = routing.route_v(routing.grid.cell_of(lon, lat), pair_obj, pair_code)
        b = self.next_batch
        self.next_batch += 1
        # The batch is serialised once (Arrow columns, into Ray's object store); each worker gets
        # it with the rows the routing table names for it.
        shared = (b, pa.table({"id": batch.column("id"), "lon": lon, "lat": lat, "t": t, "keywords": keywords}),
                  pair_obj, pair_code)
        if self.config.executor == "ray":
            import ray

            shared = ray.put(shared)
        refs, sent = [], 0
        for w, actor in enumerate(self.actors):
            mine = np.flatnonzero((masks >> np.uint64(w)) & np.uint64(1))
            if len(mine):
                refs.append(actor.process_rows.remote(shared, mine))
                sent += len(mine)
        route_ms = (time.perf_counter() - t0) * 1e3
        route_cpu_ms = (time.thread_time() - c0) * 1e3  # not inflated by workers already running
        self.store.append(batch)
        return {"batch": b, "objects": len(ids), "duplicates": dup, "refs": refs, "sent": sent, "t0": t0,
                "route_ms": route_ms, "route_cpu_ms": route_cpu_ms}

    def collect(self, pending: dict[str, Any]) -> dict[str, Any]:
        """Wait for a dispatched batch's workers; returns its row (as :meth:`process`)."""
        reports = self._get(pending["refs"])
        t0, route_ms, route_cpu_ms = pending["t0"], pending["route_ms"], pending["route_cpu_ms"]
        if self.config.executor == "inline":  # the workers ran inside the dispatch loop: not routing
            # (before the queued writes' figures join cpu_s: the write thread's CPU is not the loop's)
            route_cpu_ms -= sum(r["cpu_s"] - r["redis_server_s"] for r in reports) * 1e3
            route_ms -= sum(r["busy_s"] for r in reports) * 1e3
        queued = [r for r in reports if r.get("write_queued")]
        if queued:  # the batch is done when its writes are in Redis
            writes = self._get([self.actors[r["worker"]].written.remote(pending["batch"]) for r in queued])
            for r, w in zip(queued, writes):
                r["redis_s"], r["redis_server_s"] = w["redis_s"], w["redis_server_s"]
                r["cpu_s"] += w["writer_cpu_s"] + w["redis_server_s"]
        update_ms = (time.perf_counter() - t0) * 1e3
        W = len(self.actors)
        busy, busy_wall = np.zeros(W), np.zeros(W)  # busy: on a dedicated core (CPU + Redis server)
        per_worker = np.zeros((3, W))  # objects delivered, candidates, results changed
        for r in reports:
            busy[r["worker"]] = r["cpu_s"] * 1e3
            busy_wall[r["worker"]] = r["busy_s"] * 1e3
            per_worker[:, r["worker"]] = (r["objects"], r["candidates"], r["changed"])
        return {"batch": pending["batch"], "objects": pending["objects"], "duplicates": pending["duplicates"],
                "update_ms": update_ms,
                "busy_ms": busy.tolist(), "busy_wall_ms": busy_wall.tolist(),
                "imbalance_ms": float(busy.max() - busy.min()),
                "route_ms": route_ms, "route_cpu_ms": route_cpu_ms, "per_worker": per_worker.tolist(),
                "sim_update_ms": route_cpu_ms + float(busy.max()), "deliveries": pending["sent"],
                "redis_server_ms": sum(r["redis_server_s"] for r in reports) * 1e3,
                "candidates": sum(r["candidates"] for r in reports), "passed": sum(r["passed"] for r in reports),
                "changed": sum(r["changed"] for r in reports)}

    def batches(self) -> Iterator[pa.Table]:
        """The stream's batches, in order."""
        s, B = self.stream_table, self.config.batch
        for start in range(0, s.num_rows, B):
            yield s.slice(start, B)

    def run(self, progress: bool = True) -> dict[str, Any]:
        """Stream every batch, ``config.in_flight`` at a time; returns the run summary (see
        :func:`summarize_run`)."""
        from tqdm import tqdm

        rows = self.rows = []
        pending: deque[dict[str, Any]] = deque()
        t0 = time.perf_counter()
        with tqdm(total=self.stream_table.num_rows, unit="obj", disable=not progress, smoothing=0.1) as bar:
            for batch in self.batches():
                pending.append(self.dispatch(batch))
                bar.update(batch.num_rows)
                while len(pending) >= self.config.in_flight:
                    rows.append(self.collect(pending.popleft()))
            while pending:
                rows.append(self.collect(pending.popleft()))
        wall = time.perf_counter() - t0
        summary = self.summarize_run(rows, wall)
        summary["workers_stats"] = self.worker_stats()
        return summary

    def summarize_run(self, rows: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
        """Update time mean/p50/p99 (ms), imbalance, objects/s, deliveries, changes."""
        upd = np.array([r["update_ms"] for r in rows]) if rows else np.zeros(1)
        sim = np.array([r["sim_update_ms"] for r in rows]) if rows else np.zeros(1)
        redis_ms = np.array([r["redis_server_ms"] for r in rows]) if rows else np.zeros(1)
        objects = sum(r["objects"] for r in rows)
        changed = sum(r["changed"] for r in rows)
        cand = sum(r["candidates"] for r in rows)
        return {
            "config": asdict(self.config), "queries": len(self.query_worker), "workers": self.config.workers,
            "algorithm": self.config.algorithm, "initial_objects": self.store.initial.num_rows,
            "batches": len(rows), "objects": objects, "duplicates_ignored": sum(r["duplicates"] for r in rows),
            "wall_s": round(wall_s, 3), "objects_per_s": objects / wall_s if wall_s > 0 else 0.0,
            "update_ms_mean": float(upd.mean()), "update_ms_p50": float(np.percentile(upd, 50)),
            "update_ms_p99": float(np.percentile(upd, 99)), "update_ms_max": float(upd.max()),
            "update_ms_sim_mean": float(sim.mean()), "update_ms_sim_p99": float(np.percentile(sim, 99)),
            "imbalance_ms_mean": float(np.mean([r["imbalance_ms"] for r in rows])) if rows else 0.0,
            "deliveries_per_object": sum(r["deliveries"] for r in rows) / objects if objects else 0.0,
            "results_changed": changed, "candidates": cand, "pairs_within_radius": sum(r["passed"] for r in rows),
            "candidates_per_change": cand / changed if changed else None,
            "busy_ms_per_worker": np.sum([r["busy_ms"] for r in rows], axis=0).round(1).tolist() if rows else [],
            "route_cpu_ms_mean": float(np.mean([r["route_cpu_ms"] for r in rows])) if rows else 0.0,
            "redis_server_ms_mean": float(redis_ms.mean()), "redis_server_ms_p99": float(np.percentile(redis_ms, 99)),
            "per_worker_totals": dict(zip(("objects", "candidates", "changed"),
                                          np.sum([r["per_worker"] for r in rows], axis=0).astype(int).tolist()))
            if rows else {},
            "predicted_worker_loads": self.plan.summary["worker_loads"],
            "startup_s": {k: round(v, 3) for k, v in self.timings.items()},
            "redis_url": self.redis_url,
        }

    # -- runtime registration ----------------------------------------------------------------
    def register_query(self, qid: str, lon: float, lat: float, keywords: Sequence[str], k: int) -> int:
        """Add a query at run time; returns its worker (:meth:`register_queries` for one).

        Raises
        ------
        InvalidQueryError
            Duplicate id, ``k < 1``, bad coordinates, or no keyword after normalisation.
        """
        return self.register_queries([(qid, lon, lat, keywords, k)])[0]

    def register_queries(self, queries: Sequence[tuple[str, float, float, Sequence[str], int]]) -> list[int]:
        """Add queries ``(id, lon, lat, keywords, k)`` at run time; returns their workers.

        Keywords are normalised (:func:`normalize_keywords`); each query's initial kNN is exact
        over every object seen (one vectorised search for all). Each joins a worker by
        :meth:`_place`; the routing table learns its region; each worker gets its new queries
        in one call.

        Raises
        ------
        InvalidQueryError
            Before anything is registered: a duplicate id (registered, or twice in
            ``queries``), ``k < 1``, bad coordinates, or no keyword after normalisation.
        """
        rows = []
        for qid, lon, lat, keywords, k in queries:
            words = normalize_keywords(" ".join(keywords))
            if qid in self.query_worker or any(qid == r[0] for r in rows):
                raise InvalidQueryError(f"query {qid!r} is already registered")
            if int(k) < 1 or not words or not (abs(lon) <= 180 and abs(lat) <= 90):
                raise InvalidQueryError(f"query {qid!r}: needs k >= 1, a keyword and valid coordinates "
                                        f"(k={k}, keywords={list(keywords)}, lon={lon}, lat={lat})")
            rows.append((str(qid), float(lon), float(lat), words, int(k)))
        if not rows:
            return []
        topk, info = self.store.knn_v([r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                                      [r[4] for r in rows])
        radius = np.array([t[-1][1] if len(t) == r[4] else np.inf for r, t in zip(rows, topk)])
        rect = self.plan.model.rects(np.array([r[1] for r in rows]), np.array([r[2] for r in rows]), radius)
        routing = self.plan.routing
        mean_load = self.worker_loads.sum() / max(int(self.worker_queries.sum()), 1)
        workers, mine = [], {}
        for i, (qid, lon, lat, words, k) in enumerate(rows):
            w = self._place(lon, lat)
            self.query_worker[qid] = w
            self.worker_queries[w] += 1
            self.worker_loads[w] += mean_load
            workers.append(w)
            mine.setdefault(w, []).append(i)
        routing.add_many([[routing.code(x) for x in r[3]] for r in rows], rect.x0, rect.y0, rect.x1, rect.y1, workers)
        pending = []
        for w, sel in mine.items():
            used = {o for i in sel for o, _ in topk[i]}
            pending.append(self.actors[w].register_queries.remote(
                [rows[i][0] for i in sel], [rows[i][1] for i in sel], [rows[i][2] for i in sel],
                [rows[i][4] for i in sel], [rows[i][3] for i in sel], [topk[i] for i in sel],
                {o: info[o] for o in used}, vocabulary={x: routing.code(x) for i in sel for x in rows[i][3]}))
        self._get(pending)
        return workers

    def _place(self, lon: float, lat: float) -> int:
        """The worker of a new query: of the plan's sets whose region holds it, the one on the
        least-loaded worker, unless that worker is above 1.1x the mean load; else the
        least-loaded worker (``SPEC.md``, "Runtime registration"). Load = predicted load plus
        the mean query load per query registered since; ties by fewer queries."""
        loads, counts = self.worker_loads, self.worker_queries
        sets, set_worker = self.plan.plan.sets, self.plan.plan.set_worker
        holders = [int(set_worker[i]) for i, s in enumerate(sets)
                   if s.region[0] <= lon <= s.region[2] and s.region[1] <= lat <= s.region[3] and set_worker[i] >= 0]
        least = int(np.lexsort((counts, loads))[0])
        if not holders:
            return least
        w = min(holders, key=lambda x: (loads[x], counts[x]))
        return least if loads[w] > 1.1 * loads.mean() else w

    def unregister_query(self, qid: str) -> bool:
        """Remove a query and delete its keys; ``False`` if no such query."""
        w = self.query_worker.pop(qid, None)
        if w is None:
            return False
        self.worker_queries[w] -= 1
        return bool(self._get(self.actors[w].unregister_query.remote(qid)))

    def result(self, qid: str) -> list[tuple[str, float]]:
        """A query's current kNN as its worker holds it (Redis holds the same)."""
        return self._get(self.actors[self.query_worker[qid]].result.remote(qid))

    def worker_stats(self) -> list[dict[str, Any]]:
        """Each worker's :meth:`KnnWorker.stats`."""
        return self._get([a.stats.remote() for a in self.actors])

    # -- stop --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (and Ray if this run started it) and the embedded Redis (saved)."""
        if self.config.executor == "ray" and self.actors:
            import ray

            for a in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(a)
            if self._ray_started:
                ray.shutdown()
        self.actors = []
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _chunks(it, n: int):
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf
