"""The workers of a run, in process or as Ray actors, called the same way.

:func:`make_pool` starts ``W`` :class:`~knnmon.workers.worker.KnnWorker` s either as plain objects
in the coordinator's process (:class:`InlinePool`: one process, no serialisation; tests and the
fastest setting on one core) or as Ray actors (:class:`RayPool`: one process each, on the nodes
of a Ray cluster). Callers send with the typed calls of :class:`WorkerPool` (``process``,
``load``, ``expire``, ..., one per :class:`~knnmon.workers.interface.WorkerApi` method) and wait
with :meth:`WorkerPool.gather`; a worker that died surfaces as :class:`~knnmon.errors.WorkerLostError`
naming it (the ``ActorPool`` pattern of Ray's ``util/actor_pool.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knnmon.batch import ObjectBatch, ObjectInfo, QueryHandover, Refills
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.ray_start import init_ray
from knnmon.errors import WorkerLostError
from knnmon.query import QueryColumns
from knnmon.workers.interface import WorkerApi

__all__ = ["WORKER_CPUS", "InlinePool", "Pending", "RayPool", "WorkerPool", "init_ray", "make_pool"]

log = logging.getLogger("knnmon.runtime")

#: CPUs each worker actor reserves: a token share (1,000 workers per core), only so that Ray
#: honours its soft node affinity (an actor that reserves nothing is placed on a random node).
WORKER_CPUS = 0.001


@dataclass(frozen=True)
class Pending:
    """A call sent to worker ``worker``: its result (inline) or Ray object ref."""

    worker: int
    value: Any


class WorkerPool(ABC):
    """``size`` workers; ``call`` sends, ``gather`` waits (module docstring)."""

    #: The workers run in the caller's thread: a call returns once its work is done.
    inline: bool = False
    #: A lost worker can be made anew (:meth:`replace`) and rebuilt in place
    #: (:mod:`~knnmon.coordinator.runtime.revival`).
    revivable: bool = True

    def __init__(self, size: int) -> None:
        self.size = size
        #: What each actor taken from the service before said of its state
        #: (:meth:`~knnmon.workers.actor.WorkerHost.kept_for`), until kept or reset (a RayPool's).
        self.kept: dict[int, dict[str, Any]] = {}

    @abstractmethod
    def call(self, worker: int, method: str, *args: Any, **kwargs: Any) -> Pending:
        """Send ``method(*args, **kwargs)`` to worker ``worker`` (in order with its earlier calls)."""

    @abstractmethod
    def gather(self, pending: Sequence[Pending]) -> list[Any]:
        """The results of ``pending``, in order.

        Raises
        ------
        WorkerLostError
            A worker died (its actor process was killed, or its node was lost).
        """

    def gather_each(self, pending: Sequence[Pending]) -> list[Any]:
        """As :meth:`gather`, but a lost worker's result is its :class:`WorkerLostError` (not
        raised): the others' results are kept."""
        return self.gather(pending)

    def ready(self, pending: Sequence[Pending]) -> bool:
        """Whether every call of ``pending`` returned (or failed): :meth:`gather` would not wait."""
        return True

    def _send(self, worker: int, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Pending:
        return self.call(worker, method.__name__, *args, **kwargs)

    # The worker's calls, typed (:class:`~knnmon.workers.interface.WorkerApi`; each returns a
    # :class:`Pending` for :meth:`gather`).
    def process(self, worker: int, batch: ObjectBatch, rows: np.ndarray | None, *, cutoff: int | None = None,
                refills: Refills | None = None) -> Pending:
        """:meth:`KnnWorker.process_rows`: a shared batch's rows for ``worker`` (``None``: those
        its bitmasks give it, :meth:`ObjectBatch.rows_of`). Arguments left at their defaults are
        not sent: each one adds to the call's cost in the dispatching thread."""
        options = {k: v for k, v in (("cutoff", cutoff), ("refills", refills)) if v is not None}
        return self._send(worker, WorkerApi.process_rows, batch, *(() if rows is None else (rows,)), **options)

    def estimate(self, worker: int, batch: ObjectBatch, rows: np.ndarray) -> Pending:
        """:meth:`KnnWorker.estimate_rows`: candidates per row, nothing changed."""
        return self._send(worker, WorkerApi.estimate_rows, batch, rows)

    def written(self, worker: int, batch: int) -> Pending:
        """:meth:`KnnWorker.written`: the queued write of ``batch``."""
        return self._send(worker, WorkerApi.written, batch)

    def last_write(self, worker: int) -> Pending:
        """:meth:`KnnWorker.last_write`: its last write's marker, and whether a write failed since."""
        return self._send(worker, WorkerApi.last_write)

    def expire(self, worker: int, cutoff: int) -> Pending:
        """:meth:`KnnWorker.expire`: the queries to refill."""
        return self._send(worker, WorkerApi.expire, cutoff)

    def load(self, worker: int, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
             objects: Mapping[str, ObjectInfo], **options: Any) -> Pending:
        """:meth:`KnnWorker.load_queries` (its keyword options as given)."""
        return self._send(worker, WorkerApi.load_queries, queries, topk, objects, **options)

    def register(self, worker: int, queries: QueryColumns, topk: Sequence[Sequence[tuple[str, float]]],
                 objects: Mapping[str, ObjectInfo], *, vocabulary: Mapping[str, int] | None = None,
                 version: int = 0) -> Pending:
        """:meth:`KnnWorker.register_queries`."""
        return self._send(worker, WorkerApi.register_queries, queries, topk, objects, vocabulary=vocabulary,
                          version=version)

    def unregister(self, worker: int, qid: str, version: int = 0) -> Pending:
        """:meth:`KnnWorker.unregister_query`: ``True`` if ``worker`` held ``qid``."""
        return self._send(worker, WorkerApi.unregister_query, qid, version)

    def result(self, worker: int, qid: str) -> Pending:
        """:meth:`KnnWorker.result`."""
        return self._send(worker, WorkerApi.result, qid)

    def regions(self, worker: int) -> Pending:
        """:meth:`KnnWorker.regions`: its queries and their kNN radii."""
        return self._send(worker, WorkerApi.regions)

    def stats(self, worker: int) -> Pending:
        """:meth:`KnnWorker.stats`."""
        return self._send(worker, WorkerApi.stats)

    def query_loads(self, worker: int) -> Pending:
        """:meth:`KnnWorker.query_loads`: each query's recent measured load."""
        return self._send(worker, WorkerApi.query_loads)

    def export(self, worker: int, qids: Sequence[str]) -> Pending:
        """:meth:`KnnWorker.export_queries`: hand queries over (the worker forgets them)."""
        return self._send(worker, WorkerApi.export_queries, qids)

    def adopt(self, worker: int, handover: QueryHandover, vocabulary: Mapping[str, int] | None = None,
              note: Mapping[str, str] | None = None) -> Pending:
        """:meth:`KnnWorker.adopt_queries`."""
        return self._send(worker, WorkerApi.adopt_queries, handover, vocabulary, note)

    def export_parts(self, worker: int, parts: Sequence[Sequence[str]]) -> list[Pending]:
        """:meth:`KnnWorker.export_parts`: one export, one result per part (Ray: an object ref each)."""
        if len(parts) == 1:
            return [self.export(worker, parts[0])]
        return self._call_parts(worker, WorkerApi.export_parts.__name__, len(parts), [list(p) for p in parts])

    def _call_parts(self, worker: int, method: str, n: int, *args: Any) -> list[Pending]:
        """``method(*args)``, whose result is a tuple of ``n``, as ``n`` pending results."""
        return [Pending(worker, v) for v in self.gather([self.call(worker, method, *args)])[0]]

    def release_handed(self, worker: int) -> Pending:
        """:meth:`KnnWorker.release_handed`."""
        return self._send(worker, WorkerApi.release_handed)

    def regions_with(self, worker: int, keywords: Sequence[str]) -> Pending:
        """:meth:`KnnWorker.regions_with`: its queries holding any of ``keywords``, with their radii."""
        return self._send(worker, WorkerApi.regions_with, list(keywords))

    def kept_queries(self, worker: int) -> Pending:
        """:meth:`KnnWorker.kept_queries`: its queries, radii, result sizes and keyword codes."""
        return self._send(worker, WorkerApi.kept_queries)

    def holds_among(self, worker: int, oids: Sequence[str]) -> Pending:
        """:meth:`KnnWorker.holds_among`: the ids among ``oids`` its lists hold."""
        return self._send(worker, WorkerApi.holds_among, oids)

    def keep_for(self, worker: int) -> Pending:
        """:meth:`KnnWorker.keep_for`: a kept worker becomes this service's."""
        return self._send(worker, WorkerApi.keep_for)

    def reset_taken(self) -> None:
        """Make the workers taken from the service before empty (:attr:`kept`; none but in a
        :class:`RayPool` with ``detach_as``)."""
        self.kept = {}

    def share(self, obj: Any) -> Any:
        """``obj`` as the workers receive it without one copy each (Ray's object store)."""
        return obj

    @abstractmethod
    def replace(self, worker: int, **overrides: Any) -> None:
        """Start worker ``worker`` anew, empty, with its settings but ``overrides``; the caller
        loads its queries (a revival)."""

    @abstractmethod
    def close(self) -> None:
        """Stop the workers."""


class InlinePool(WorkerPool):
    """Workers as plain objects in this process (``executor="inline"``).

    A worker is lost when one of its calls raises :class:`~knnmon.errors.WorkerLostError` or
    :meth:`kill` is called (what tests use to lose a worker in process): its calls then fail as
    a dead Ray actor's do, until :meth:`replace` makes it anew with ``make``.
    """

    inline = True

    def __init__(self, workers: Sequence[Any], make: Callable[..., Any] | None = None) -> None:
        super().__init__(len(workers))
        self.workers = list(workers)
        self._make = make
        #: The workers lost and not yet replaced.
        self.lost: set[int] = set()

    @property
    def revivable(self) -> bool:
        return self._make is not None

    def call(self, worker: int, method: str, *args: Any, **kwargs: Any) -> Pending:
        if worker in self.lost:
            return Pending(worker, WorkerLostError(worker, "its in-process worker was lost"))
        try:
            return Pending(worker, getattr(self.workers[worker], method)(*args, **kwargs))
        except WorkerLostError as ex:
            self.lost.add(worker)
            return Pending(worker, ex)

    def gather(self, pending: Sequence[Pending]) -> list[Any]:
        out = self.gather_each(pending)
        lost = next((x for x in out if isinstance(x, WorkerLostError)), None)  # the first, in call order
        if lost is not None:
            raise lost
        return out

    def gather_each(self, pending: Sequence[Pending]) -> list[Any]:
        return [p.value for p in pending]

    def kill(self, worker: int) -> None:
        """Lose worker ``worker``: its state is gone and its calls fail until :meth:`replace`."""
        self.lost.add(worker)

    def replace(self, worker: int, **overrides: Any) -> None:
        """Make worker ``worker`` anew, empty, with its settings but ``overrides`` (as
        :meth:`RayPool.replace`); the caller loads its queries."""
        self.workers[worker] = self._make(worker, **overrides)
        self.lost.discard(worker)

    def close(self) -> None:
        self.workers = []


#: A batch smaller than this (its Arrow table, bytes) is sent inline rather than put in Ray's object store.
SHARE_MIN_BYTES = 64 * 1024


class RayPool(WorkerPool):
    """Workers as Ray actors (``executor="ray"``), one per worker, spread over the alive nodes.

    Worker ``w`` goes to node ``w mod (alive nodes)``, softly (elsewhere if that node cannot
    take it): Ray's SPREAD is best effort and was seen placing 3 workers on one of 3 nodes. The
    actor asks for a token CPU share (:data:`WORKER_CPUS`): Ray places an actor that asks for no
    resources on a random node unless its node affinity is hard.
    """

    def __init__(self, size: int, worker_args: Mapping[str, Any], ray_address: str | None = None,
                 detach_as: str | None = None, spare: bool = False) -> None:
        super().__init__(size)
        import ray

        self._ray, self._args = ray, dict(worker_args)
        self._started_ray = init_ray(ray_address)
        self._detach_as = detach_as
        if detach_as is not None:
            from knnmon.workers.actor import ORPHAN_S

            self._args.setdefault("orphan_s", ORPHAN_S)
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        self.spare = None
        taken = self._take_left(size, spare) if detach_as is not None else {}
        log.info("starting %d workers on %d alive Ray nodes: %s%s", size, len(nodes), ", ".join(n[:8] for n in nodes),
                 f" ({len(taken)} taken from the service before{', and its spare' if self.spare else ''})"
                 if taken else "")
        self.actors = [taken[w] if w in taken else self._new_actor(w, nodes) for w in range(size)]
        self.taken = len(taken)
        self._keep_spare = spare
        if spare and self.spare is None:
            self.spare = self._new_spare(nodes)

    def _new_actor(self, worker: int, nodes: Sequence[str], *, name: str | None = None, **overrides: Any) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from knnmon.workers.actor import RAY_NAMESPACE, WorkerActor

        options: dict[str, Any] = {}
        if self._detach_as is not None:
            import uuid

            options = {"name": f"{self._detach_as}:{name or worker}:{uuid.uuid4().hex[:8]}",
                       "namespace": RAY_NAMESPACE, "lifetime": "detached"}
        return WorkerActor(num_cpus=WORKER_CPUS, scheduling_strategy=NodeAffinitySchedulingStrategy(
            nodes[worker % len(nodes)], soft=True), **options).remote(worker, **{**self._args, **overrides})

    def _new_spare(self, nodes: Sequence[str]) -> Any:
        """A started, empty actor for the next :meth:`replace` (no Redis writer: the reset that
        makes it a worker gives it one); it watches the heartbeat as the workers do."""
        return self._new_actor(self.size, nodes, name="spare", redis_url=None, watch_url=self._args.get("redis_url"))

    def _take_left(self, size: int, spare: bool = False, timeout_s: float = 30.0) -> dict[int, Any]:
        """The detached actors a service before this one left under :attr:`_detach_as` (a
        SIGKILLed service's), as they are: one per worker number below ``size`` that answers
        within ``timeout_s`` (the one that was that worker if alive, else any other), what each
        said of its state in :attr:`kept`; with ``spare``, an empty one left over as
        :attr:`spare`; every other one is killed. Their queued writes end before
        this returns, so Redis is read after them. The caller keeps them
        (:mod:`~knnmon.coordinator.runtime.kept_start`) or resets them (:meth:`reset_taken`)."""
        from ray.util import list_named_actors

        from knnmon.workers.actor import RAY_NAMESPACE

        ray, prefix = self._ray, f"{self._detach_as}:"
        found: dict[int, list[Any]] = {}
        for entry in list_named_actors(all_namespaces=True):  # ({"name", "namespace"} each)
            name = entry["name"]
            if entry["namespace"] != RAY_NAMESPACE or not name.startswith(prefix):
                continue
            with contextlib.suppress(ValueError):  # (gone meanwhile)
                number = name[len(prefix):].split(":", 1)[0]
                found.setdefault(int(number) if number.isdigit() else -1, []).append(
                    ray.get_actor(name, namespace=RAY_NAMESPACE))
        # Every actor says what it holds (a revived worker keeps the name of the spare it was);
        # worker w takes the one that was worker w, the others fill the gaps (a spare first),
        # and with spare=True one empty one left over stays the spare.
        handles = [h for _, hs in sorted(found.items()) for h in hs]
        asked = [h.kept_for.remote(None, **self._args) for h in handles]
        answers: list[tuple[Any, dict[str, Any]]] = []
        for h, ref in zip(handles, asked):
            try:
                answers.append((h, ray.get(ref, timeout=timeout_s)))
            except Exception as ex:  # noqa: BLE001 - dead, or busy past the timeout: a new one
                log.warning("an actor of the service before did not answer (%s); killed", type(ex).__name__)
                with contextlib.suppress(Exception):
                    ray.kill(h)
        taken: dict[int, Any] = {}
        rest = []
        for h, state in answers:
            w = state["worker"]
            if 0 <= w < size and w not in taken and state["writes"]:
                taken[w], self.kept[w] = h, state
            else:
                rest.append((h, state))
        rest.sort(key=lambda x: x[1]["writes"])  # (empty spares first)
        for w in range(size):
            if w not in taken and rest:
                h, state = rest.pop(0)
                taken[w], self.kept[w] = h, {**state, "why": state["why"] or f"it was worker {state['worker']}"}
        if spare and rest and not rest[0][1]["writes"]:
            self.spare = rest.pop(0)[0]
        for h, _ in rest:
            with contextlib.suppress(Exception):
                ray.kill(h)
        return taken

    def reset_taken(self, timeout_s: float = 30.0) -> None:
        """Make every actor taken from the service before an empty worker (their state is not
        kept: :mod:`~knnmon.coordinator.runtime.kept_start`); one that does not reset within
        ``timeout_s`` is replaced by a new actor."""
        resets = {w: self.actors[w].reset.remote(w, **self._args) for w in self.kept}
        self.kept = {}
        nodes = sorted(n["NodeID"] for n in self._ray.nodes() if n["Alive"])
        for w, ref in resets.items():
            try:
                self._ray.get(ref, timeout=timeout_s)
            except Exception as ex:  # noqa: BLE001 - dead, or busy past the timeout: a new one
                log.warning("worker %d's actor of the service before did not reset (%s); starting a new one", w,
                            type(ex).__name__)
                with contextlib.suppress(Exception):
                    self._ray.kill(self.actors[w])
                self.actors[w] = self._new_actor(w, nodes)
                self.taken -= 1

    def replace(self, worker: int, **overrides: Any) -> None:
        """Start worker ``worker`` anew on an alive node: an empty worker with the same settings
        but ``overrides`` (e.g. the keyword ``vocabulary`` as it has grown); the caller loads its
        queries. With a spare (``spare=True``), the spare becomes the worker (a reset, queued
        before the caller's calls: no process to start) and a new spare starts; a spare that
        died with its node fails those calls, and the revival after that starts a new actor."""
        with contextlib.suppress(Exception):
            self._ray.kill(self.actors[worker])
        nodes = sorted(n["NodeID"] for n in self._ray.nodes() if n["Alive"])
        if self.spare is not None:
            self.actors[worker], self.spare = self.spare, None
            self.actors[worker].reset.remote(worker, **{**self._args, **overrides})
        else:
            self.actors[worker] = self._new_actor(worker, nodes, **overrides)
        if self._keep_spare:
            self.spare = self._new_spare(nodes)

    def call(self, worker: int, method: str, *args: Any, **kwargs: Any) -> Pending:
        return Pending(worker, getattr(self.actors[worker], method).remote(*args, **kwargs))

    def _call_parts(self, worker: int, method: str, n: int, *args: Any) -> list[Pending]:
        refs = getattr(self.actors[worker], method).options(num_returns=n).remote(*args)
        return [Pending(worker, r) for r in refs]

    def gather(self, pending: Sequence[Pending]) -> list[Any]:
        out = self.gather_each(pending)
        lost = next((x for x in out if isinstance(x, WorkerLostError)), None)  # the first, in call order
        if lost is not None:
            raise lost
        return out

    def ready(self, pending: Sequence[Pending]) -> bool:
        refs = [p.value for p in pending]
        done, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(done) == len(refs)

    def gather_each(self, pending: Sequence[Pending]) -> list[Any]:
        from ray.exceptions import RayActorError

        try:
            return self._ray.get([p.value for p in pending])  # one wait for all
        except RayActorError:
            out = []
            for p in pending:  # which workers: those whose calls fail so
                try:
                    out.append(self._ray.get(p.value))
                except RayActorError as ex:
                    lost = WorkerLostError(p.worker, f"its Ray actor died ({type(ex).__name__})")
                    lost.__cause__ = ex
                    out.append(lost)
            return out

    def share(self, obj: Any) -> Any:
        """``obj`` in Ray's object store, once for every worker; a batch whose table is below
        :data:`SHARE_MIN_BYTES` goes inline in each call instead (a ``ray.put`` costs more than
        copying a few objects: a served object waits for it)."""
        table = getattr(obj, "table", None)
        if table is not None and table.nbytes < SHARE_MIN_BYTES:
            return obj
        return self._ray.put(obj)

    def kill(self, worker: int) -> None:
        """Kill worker ``worker``'s actor (tests of a lost worker; the next issue restarts it)."""
        self._ray.kill(self.actors[worker])

    def close(self) -> None:
        for a in [*self.actors, *([self.spare] if self.spare is not None else [])]:
            with contextlib.suppress(Exception):
                self._ray.kill(a)
        self.actors, self.spare = [], None
        if self._started_ray:
            self._ray.shutdown()


def make_pool(config: RunConfig, redis_url: str | None, vocabulary: Mapping[str, int], *,
              detach: bool = False) -> WorkerPool:
    """``config.workers`` workers writing to ``redis_url`` under ``config.store.namespace``, in
    process or as Ray actors (``config.executor``); ``vocabulary``: keyword codes of the routing
    table the workers know from the start (the runtime gives none: each load, registration and
    hand-over brings the codes of its queries' keywords, so a worker holds only its own).

    ``detach``: on a Ray cluster that outlives this process (``ray_address`` or ``RAY_ADDRESS``
    given), start the actors detached and take those a service before left in this namespace
    of this Redis (:mod:`knnmon.workers.actor`; ``knnmon serve``, whose heartbeat they watch),
    and keep a spare actor started for revivals (:meth:`RayPool.replace`)."""
    from knnmon.workers.worker import KnnWorker

    args = {"redis_url": redis_url, "namespace": config.store.namespace, "vocabulary": vocabulary,
            "index": config.index, "overlap_writes": config.overlap_writes, "reserve": config.places_reserved,
            "track_load": config.rebalance is not None, "release_groups": config.release_groups,
            "redis_wait_s": config.redis_wait_s}
    if config.executor == "inline":
        return InlinePool([KnnWorker(w, **args) for w in range(config.workers)],
                          make=lambda w, **overrides: KnnWorker(w, **{**args, **overrides}))
    detach_as = None
    if detach and redis_url and (config.ray_address or os.environ.get("RAY_ADDRESS")):
        import hashlib

        from knnmon.connection import redact

        where = f"{redact(redis_url)}|{config.store.namespace}".encode("utf-8", "surrogateescape")
        detach_as = f"knnmon-{hashlib.sha1(where).hexdigest()[:12]}"
    return RayPool(config.workers, args, config.ray_address, detach_as, spare=detach_as is not None)
