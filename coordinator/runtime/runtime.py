"""The distributed runtime: plan, start workers, load the initial kNN, stream object batches.

:class:`Runtime` is what ``knnmon run``, ``knnmon demo``, the bench and the service drive. It
puts the runtime's parts together and owns their lifetimes:

1. :mod:`~knnmon.coordinator.runtime.preparation` -- objects in stream order, the first
   ``initial`` seen before the stream starts, and every query's exact initial kNN over them;
2. :mod:`~knnmon.coordinator.planning` -- the plan over those kNN radii;
3. :func:`~knnmon.store.open_store` and :mod:`~knnmon.coordinator.runtime.worker_pool` --
   the results store and ``W`` workers (Ray actors or in process);
4. :mod:`~knnmon.coordinator.runtime.registration` -- each worker gets its queries;
5. :mod:`~knnmon.coordinator.runtime.dispatch` -- the stream, in batches, measured
   (:mod:`~knnmon.coordinator.runtime.metrics`);
6. with ``--rebalance``, :mod:`knnmon.coordinator.rebalance` (given as the ``rebalancer``
   factory: it drives the runtime's workers, so the runtime does not import it) -- after each
   batch, queries move between workers when their measured load is uneven;
7. :class:`~knnmon.coordinator.recovery.reviver.Reviver` (given as the ``reviver`` factory, for
   the same reason) -- a lost worker revived in place.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from knnmon.coordinator.planning import PlanResult, plan_prepared
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.dispatch import Admission, DispatchedBatch, Dispatcher
from knnmon.coordinator.runtime.metrics import BatchReport, RunSummary, summarize_run
from knnmon.coordinator.runtime.object_store import ObjectStore
from knnmon.coordinator.runtime.plan_record import record_plan
from knnmon.coordinator.runtime.preparation import Prepared, prepare
from knnmon.coordinator.runtime.rebalance_config import Replan
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.runtime.routing_upkeep import RoutingUpkeep
from knnmon.coordinator.runtime.runtime_status import RuntimeStatus
from knnmon.coordinator.runtime.worker_pool import WorkerPool, make_pool
from knnmon.errors import InvalidArgumentError
from knnmon.heap import give_back
from knnmon.query import Query
from knnmon.reports import WorkerStats
from knnmon.store import Store, clear_namespace, open_store
from knnmon.window import Window

if TYPE_CHECKING:
    from knnmon.coordinator.recovery.stored_start import StoredStart

__all__ = ["NoRevival", "Rebalancing", "Reviving", "Runtime"]

T = TypeVar("T")


class Rebalancing(Protocol):
    """Re-balancing as the runtime drives it: what
    :class:`~knnmon.coordinator.rebalance.rebalancer.Rebalancer` does, made by the factory
    :class:`Runtime` is given once its workers and registrar are up."""

    #: Each re-plan's record, and the queries moved so far.
    replans: list[Replan]
    queries_moved: int

    def after_batch(self, batch: int, busy_ms: Sequence[float], *, idle: bool = False,
                    wait_moves: bool = True) -> object: ...

    def close(self) -> None: ...


#: ``(pool, registrar, set_of, config, *, redis_url, namespace, revive) -> Rebalancing``: the
#: :class:`~knnmon.coordinator.rebalance.rebalancer.Rebalancer` class itself.
RebalancerFactory = Callable[..., Rebalancing]


class Reviving(Protocol):
    """Lost workers revived in place, as the runtime asks for it: what
    :class:`~knnmon.coordinator.recovery.reviver.Reviver` does, made by the factory
    :class:`Runtime` is given (``reviver(runtime)``)."""

    #: Lost workers brought back so far; the one being revived now, or ``None``.
    workers_revived: int
    reviving: int | None

    def collect(self, d: DispatchedBatch, later: deque[DispatchedBatch]) -> BatchReport: ...

    def call(self, call: Callable[[], T]) -> T: ...

    def revive_idle(self, worker: int, also: Sequence[str] = ()) -> object | None: ...


class NoRevival:
    """A runtime given no reviver: a lost worker fails the call that finds it
    (:class:`~knnmon.errors.WorkerLostError`)."""

    workers_revived = 0
    reviving = None

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self, d: DispatchedBatch, later: deque[DispatchedBatch]) -> BatchReport:
        return self.runtime.dispatcher.collect(d)

    def call(self, call: Callable[[], T]) -> T:
        return call()

    def revive_idle(self, worker: int, also: Sequence[str] = ()) -> None:
        return None


class Runtime:
    """One run of knnmon (module docstring). Use as a context manager, or call :meth:`close`.

    Parameters
    ----------
    objects_dir
        An ingest output directory (``None`` with ``prepared``).
    queries
        A query file path, or a query table (``id``, ``lon``, ``lat``, ``keywords``, ``k``).
    config
        :class:`RunConfig`.
    prepared
        The stream and initial kNN from :func:`prepare` or
        :func:`~knnmon.coordinator.runtime.preparation.prepare_tables`, to reuse across runs
        (benchmarks); computed by :meth:`start` when omitted.
    resume
        Redis already holds these queries and exactly these results (a service resuming): keep
        the namespace, do not rewrite the results, only record each query's new ``worker``.
        Default: a run starts from an empty namespace.
    pool
        Workers started already, empty (a service starts them while it reads Redis); the runtime
        owns them from here. Default: :meth:`start` starts them (:func:`make_pool`).
    stored
        With ``resume``: start every worker from the results Redis holds (``prepared`` holds the
        queries and the live objects, no kNN; :mod:`~knnmon.coordinator.recovery.stored_start`).
    rebalancer
        Makes the re-balancing with ``config.rebalance``
        (:class:`~knnmon.coordinator.rebalance.rebalancer.Rebalancer`).
    reviver
        Makes what revives a lost worker in place
        (:class:`~knnmon.coordinator.recovery.reviver.Reviver`); default :class:`NoRevival`.

    Raises
    ------
    InvalidArgumentError
        ``config.rebalance`` without ``rebalancer``.

    Attributes (after :meth:`start`)
    ----------
    store, pool, plan, objects, registrar, dispatcher, upkeep, rebalancer
        The results store, the workers, the plan, every object seen (with a window: the live
        ones), who holds which query, the batch router, the routing table's rebuilds, the
        re-balancing (``None`` without ``config.rebalance``).
    reports : list of BatchReport
        The batches :meth:`run` measured so far.
    reviver : Reviving
        Lost workers revived in place: how many (``workers_revived``, also a property here) and
        the one being revived.
    """

    def __init__(self, objects_dir: str | None, queries: str | pa.Table | None, config: RunConfig,
                 prepared: Prepared | None = None, *, resume: bool = False, pool: WorkerPool | None = None,
                 stored: StoredStart | None = None, rebalancer: RebalancerFactory | None = None,
                 reviver: Callable[[Runtime], Reviving] = NoRevival) -> None:
        if config.rebalance is not None and rebalancer is None:
            raise InvalidArgumentError("a run that re-balances needs its rebalancer "
                                       "(knnmon.coordinator.rebalance.rebalancer.Rebalancer)")
        self.config, self.resume, self.prepared, self.stored = config, resume, prepared, stored
        self._make_rebalancer = rebalancer
        self.objects_dir, self._queries_arg = objects_dir, queries
        self._exit = contextlib.ExitStack()
        self.store: Store | None = None
        self.pool: WorkerPool | None = pool
        if pool is not None:
            self._exit.callback(pool.close)  # (closed with the runtime, even if start never ran)
        self.plan: PlanResult | None = None
        self.objects: ObjectStore | None = None
        self.registrar: Registrar | None = None
        self.dispatcher: Dispatcher | None = None
        self.upkeep: RoutingUpkeep | None = None
        self.rebalancer: Rebalancing | None = None
        self.stream_table: pa.Table | None = None
        self.timings: dict[str, float] = {}
        self.reports: list[BatchReport] = []
        self.reviver = reviver(self)

    def start(self) -> Runtime:
        """Read, plan, open the store, start the workers, load every query's initial kNN (or,
        with :attr:`stored`, each worker's stored results, and replay what was in flight)."""
        c = self.config
        p = self.prepared if self.prepared is not None else prepare(self.objects_dir, self._queries_arg, c)
        self.prepared = p
        self.timings.update(p.timings)
        self.stream_table = p.stream
        t0 = time.perf_counter()
        try:
            self.store = self._exit.enter_context(open_store(c.store))
            if not self.resume:
                clear_namespace(self.store)
            if self.pool is None:
                self.pool = make_pool(c, self.store.url)  # each load brings its queries' keyword codes
                self._exit.callback(self.pool.close)
            self.timings["start_workers_s"] = time.perf_counter() - t0
            resumed = self.stored.start(self, p) if self.stored is not None else self._plan_and_load(p)
        except BaseException:
            self.close()
            raise
        t = p.initial.column("t").to_numpy()
        window = None if c.window is None else Window(c.window, int(t.max()) if len(t) else None, c.allowed_lateness)
        self.upkeep = RoutingUpkeep(self.plan.routing, self.plan.model, self.pool, c.routing_entries)
        self._exit.callback(self.upkeep.close)

        def in_place(worker: int) -> bool:  # (the rebalancer's way to revive a worker)
            return self.revive_idle(worker) is not None

        self.dispatcher = Dispatcher(self.pool, self.plan.routing, self.objects, p.initial.column("id"),
                                     seen_times=t, window=window, rects=self.plan.model.rects,
                                     first_batch=p.first_batch)
        if c.rebalance is not None:
            ids = p.queries.column("id").to_pylist()
            set_of = dict(zip(ids, self.plan.plan.set_of.tolist())) if len(self.plan.plan.set_of) == len(ids) else {}
            self.rebalancer = self._make_rebalancer(self.pool, self.registrar, set_of, c.rebalance,
                                                    redis_url=self.store.url, namespace=c.store.namespace,
                                                    revive=in_place)
            self._exit.callback(self.rebalancer.close)
        if resumed is not None:
            self.upkeep.request()  # the regions' table, built in the background (stored_start.coarse_routing)
            t0 = time.perf_counter()
            self.timings["replayed"] = resumed.replay(self)
            self.timings["replay_s"] = time.perf_counter() - t0
            self.stored = None  # (the timings say it started so)
        self.prepared = None  # (its objects and their index are the store's now, dropped as they expire)
        return self

    def _plan_and_load(self, p: Prepared) -> None:
        """Plan over the initial kNN radii (``plan_s``), then load every worker (``load_s``)."""
        c, t0 = self.config, time.perf_counter()
        self.plan = plan_prepared(p, c)
        give_back()  # the plan's transients (GBs at millions of queries)
        self.timings["plan_s"] = time.perf_counter() - t0
        self.hold_objects(p)
        self.timings["load_s"] = self.registrar.load(p, resume=self.resume, redis_url=self.store.url,
                                                     namespace=c.store.namespace)
        give_back()  # the load's payloads
        record_plan(self.store.url, c.store.namespace, self.plan)

    def hold_objects(self, p: Prepared) -> None:
        """The object store over ``p.initial`` and the registrar (once :attr:`plan` is made)."""
        self.objects = self._exit.enter_context(ObjectStore(p.initial, p.index))
        self.registrar = Registrar(self.pool, self.plan, self.objects, self.config.places_reserved,
                                   feed_version=lambda: 0 if self.dispatcher is None else self.dispatcher.next_batch,
                                   revive_worker=self.revive_idle)

    @property
    def workers_revived(self) -> int:
        """Lost workers brought back so far (:attr:`Reviver.workers_revived`)."""
        return self.reviver.workers_revived

    def revive_idle(self, worker: int, also: Sequence[str] = ()) -> object | None:
        """:meth:`Reviver.revive_idle`: ``worker``, lost with no batch in flight, revived in
        place (its :class:`~knnmon.coordinator.recovery.revival.Revival`); ``None`` if it cannot
        be."""
        return self.reviver.revive_idle(worker, also)

    # -- the stream ------------------------------------------------------------------------------
    def process(self, batch: pa.Table, admitted: bool = False) -> BatchReport:
        """Stream one batch of objects (``id``, ``lon``, ``lat``, ``t``, ``keywords``) and wait
        for it (:meth:`Dispatcher.collect` of :meth:`Dispatcher.dispatch`). ``admitted``: every
        object passed :meth:`admit` (``knnmon serve``: decided once, at the read)."""
        report = self.reviver.collect(self.dispatcher.dispatch(batch, admitted), deque())
        self.upkeep_routing()
        self.rebalance(report, idle=True)
        return report

    def rebalance(self, report: BatchReport, *, idle: bool = False, wait_moves: bool = True) -> None:
        """With ``config.rebalance``: observe a collected batch, re-plan and move when due
        (:mod:`knnmon.coordinator.rebalance`), between dispatches; ``idle``: none in flight;
        ``wait_moves=False``: a move's hand-over goes on beside the next batches
        (:mod:`~knnmon.coordinator.rebalance.handover_flight`; a worker lost during it stops the
        run) instead of being waited for (a lost worker revived in place when ``idle``)."""
        if self.rebalancer is not None:
            self.rebalancer.after_batch(report.batch, report.busy_ms, idle=idle, wait_moves=wait_moves)

    def upkeep_routing(self) -> None:
        """Swap in a finished routing-table rebuild, or start one in the background when due
        (:mod:`~knnmon.coordinator.runtime.routing_upkeep`); returns at once."""
        r = self.registrar
        self.upkeep.poll(len(r.query_worker), r.unregistered)
        self.timings["routing_rebuild_s"] = self.upkeep.build_s
        self.timings["routing_swap_s"] = self.upkeep.swap_s

    # -- what the service asks (a narrow face: the service reaches no further) ------------------
    def admit(self, ids: Sequence[str], t: np.ndarray) -> Admission:
        """Which of a batch's objects are duplicates or late (:meth:`Dispatcher.admit`)."""
        return self.dispatcher.admit(ids, t)

    @property
    def window(self) -> Window | None:
        """The sliding window (its watermark and cutoff move with each batch), or ``None``."""
        return self.dispatcher.window

    @property
    def refill_parts_ms(self) -> dict[str, float]:
        """With a window, the last batch's refill step in parts, ms (:class:`Dispatcher`)."""
        return self.dispatcher.refill_parts_ms

    def holds(self, qid: str) -> bool:
        """Whether query ``qid`` is registered."""
        return qid in self.registrar.query_worker

    def register(self, queries: Sequence[Query]) -> None:
        """Register queries (new ids) with their exact kNN (:meth:`Registrar.register`)."""
        self.registrar.register(queries)

    def unregister(self, qid: str) -> bool:
        """Unregister a query; ``False`` if it was not registered."""
        return self.registrar.unregister(qid)

    def worker_processes(self) -> list[WorkerStats]:
        """Each worker's stats, for its number, node and process id (one call per worker; a lost
        worker is revived first, :meth:`Reviver.call`)."""
        return self.reviver.call(self.registrar.stats)

    def last_writes(self) -> list[tuple[str | None, bool]]:
        """Each worker's last write's marker value and whether a write failed since
        (:meth:`KnnWorker.last_write`), for a check that Redis kept every write."""
        return self.reviver.call(lambda: self.pool.gather([self.pool.last_write(w) for w in range(self.pool.size)]))

    def status(self) -> RuntimeStatus:
        """What the service's status reports of the runtime (:meth:`RuntimeStatus.of`)."""
        return RuntimeStatus.of(self)

    def batches(self) -> Iterator[pa.Table]:
        """The stream's batches, in order."""
        s, B = self.stream_table, self.config.batch
        for start in range(0, s.num_rows, B):
            yield s.slice(start, B)

    def run(self, progress: bool = True) -> RunSummary:
        """Stream every batch, ``config.in_flight`` at a time; returns the run's summary."""
        from tqdm import tqdm

        reports = self.reports = []
        pending: deque[DispatchedBatch] = deque()
        t0 = time.perf_counter()
        with tqdm(total=self.stream_table.num_rows, unit="obj", disable=not progress, smoothing=0.1) as bar:
            for batch in self.batches():
                pending.append(self.dispatcher.dispatch(batch))
                bar.update(batch.num_rows)
                while len(pending) >= self.config.in_flight:
                    reports.append(self.reviver.collect(pending.popleft(), pending))
                    self.upkeep_routing()
                    self.rebalance(reports[-1], idle=not pending, wait_moves=False)
            while pending:
                reports.append(self.reviver.collect(pending.popleft(), pending))
        return self.summary(time.perf_counter() - t0, with_stats=True)

    def summary(self, wall_s: float | None = None, *, with_stats: bool = False) -> RunSummary:
        """The :class:`RunSummary` of the batches so far (``wall_s``: default, their update
        times summed); ``with_stats`` also asks each worker for its stats."""
        wall = sum(r.update_ms for r in self.reports) / 1e3 if wall_s is None else wall_s
        return summarize_run(self.reports, wall, config=self.config, queries=len(self.registrar.query_worker),
                             initial_objects=self.objects.initial_objects,
                             predicted_worker_loads=self.plan.summary["worker_loads"], startup_s=self.timings,
                             results_store=self.store.describe(), workers_revived=self.workers_revived,
                             workers_stats=self.registrar.stats() if with_stats else None,
                             replans=self.rebalancer.replans if self.rebalancer is not None else None)

    # -- stop ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (and Ray if this run started it) and the embedded Redis (saved)."""
        self._exit.close()
        self.pool = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
