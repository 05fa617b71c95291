"""The workers as Ray actors (``executor="ray"``): :class:`RayPool`, one actor per worker
(:mod:`~knnmon.coordinator.runtime.worker_pool` has the calls every pool shares)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from knnmon.coordinator.runtime.ray_start import init_ray, shutdown_ray
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import WorkerLostError
from knnmon.reports import KeptReport
from knnmon.workers.settings import ORPHAN_S, WorkerSettings

__all__ = ["SHARE_MIN_BYTES", "WORKER_CPUS", "RayPool"]

log = logging.getLogger("knnmon.runtime")

T = TypeVar("T")

#: CPUs each worker actor reserves: a token share (1,000 workers per core), only so that Ray
#: honours its soft node affinity (an actor that reserves nothing is placed on a random node).
WORKER_CPUS = 0.001

#: A batch smaller than this (its Arrow table, bytes) is sent inline rather than put in Ray's object store.
SHARE_MIN_BYTES = 64 * 1024


class RayPool(WorkerPool):
    """Workers as Ray actors (``executor="ray"``), one per worker, spread over the alive nodes.

    Worker ``w`` goes to node ``w mod (alive nodes)``, softly (elsewhere if that node cannot
    take it): Ray's SPREAD is best effort and was seen placing 3 workers on one of 3 nodes. The
    actor asks for a token CPU share (:data:`WORKER_CPUS`): Ray places an actor that asks for no
    resources on a random node unless its node affinity is hard.

    Detached actors (``detach_as``) exit on their own once the service's heartbeat is older than
    ``orphan_s`` seconds (``None``: never; :mod:`knnmon.workers.actor`).
    """

    def __init__(self, size: int, settings: WorkerSettings, ray_address: str | None = None,
                 detach_as: str | None = None, spare: bool = False, orphan_s: float | None = ORPHAN_S) -> None:
        super().__init__(size)
        import ray

        self._ray, self._settings = ray, settings
        self._started_ray = init_ray(ray_address)
        self._detach_as = detach_as
        self._orphan_s = orphan_s if detach_as is not None else None  # (detached actors watch the service)
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

    def _new_actor(self, worker: int, nodes: Sequence[str], *, name: str | None = None,
                   settings: WorkerSettings | None = None, watch_url: str | None = None) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from knnmon.workers.actor import RAY_NAMESPACE, WorkerActor

        options: dict[str, Any] = {}
        if self._detach_as is not None:
            import uuid

            options = {"name": f"{self._detach_as}:{name or worker}:{uuid.uuid4().hex[:8]}",
                       "namespace": RAY_NAMESPACE, "lifetime": "detached"}
        return WorkerActor(num_cpus=WORKER_CPUS, scheduling_strategy=NodeAffinitySchedulingStrategy(
            nodes[worker % len(nodes)], soft=True), **options).remote(worker, settings or self._settings,
                                                                      orphan_s=self._orphan_s, watch_url=watch_url)

    def _new_spare(self, nodes: Sequence[str]) -> Any:
        """A started, empty actor for the next :meth:`replace` (no Redis writer: the reset that
        makes it a worker gives it one); it watches the heartbeat as the workers do."""
        no_writer = dataclasses.replace(self._settings, redis_url=None)
        return self._new_actor(self.size, nodes, name="spare", settings=no_writer, watch_url=self._settings.redis_url)

    def _take_left(self, size: int, spare: bool = False, timeout_s: float = 30.0) -> dict[int, Any]:
        """The detached actors a service before this one left under :attr:`_detach_as` (a
        SIGKILLed service's), as they are: one per worker number below ``size`` that answers
        within ``timeout_s`` (the one that was that worker if alive, else any other), what each
        said of its state in :attr:`kept`; with ``spare``, an empty one left over as
        :attr:`spare`; every other one is killed. Their queued writes end before
        this returns, so Redis is read after them. The caller keeps them
        (:mod:`~knnmon.coordinator.recovery.kept_start`) or resets them (:meth:`reset_taken`)."""
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
        asked = [h.kept_for.remote(None, self._settings) for h in handles]
        answers: list[tuple[Any, KeptReport]] = []
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
            w = state.worker
            if 0 <= w < size and w not in taken and state.writes:
                taken[w], self.kept[w] = h, state
            else:
                rest.append((h, state))
        rest.sort(key=lambda x: x[1].writes)  # (empty spares first)
        for w in range(size):
            if w not in taken and rest:
                h, state = rest.pop(0)
                taken[w], self.kept[w] = h, dataclasses.replace(state, why=state.why or f"it was worker {state.worker}")
        if spare and rest and not rest[0][1].writes:
            self.spare = rest.pop(0)[0]
        for h, _ in rest:
            with contextlib.suppress(Exception):
                ray.kill(h)
        return taken

    def reset_taken(self, timeout_s: float = 30.0) -> None:
        """Make every actor taken from the service before an empty worker (their state is not
        kept: :mod:`~knnmon.coordinator.recovery.kept_start`); one that does not reset within
        ``timeout_s`` is replaced by a new actor."""
        resets = {w: self.actors[w].reset.remote(w, self._settings, orphan_s=self._orphan_s) for w in self.kept}
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

    def replace(self, worker: int) -> None:
        """Start worker ``worker`` anew on an alive node, empty, with the pool's settings; the
        caller loads its queries. With a spare (``spare=True``), the spare becomes the worker (a reset, queued
        before the caller's calls: no process to start) and a new spare starts; a spare that
        died with its node fails those calls, and the revival after that starts a new actor."""
        with contextlib.suppress(Exception):
            self._ray.kill(self.actors[worker])
        nodes = sorted(n["NodeID"] for n in self._ray.nodes() if n["Alive"])
        if self.spare is not None:
            self.actors[worker], self.spare = self.spare, None
            self.actors[worker].reset.remote(worker, self._settings, orphan_s=self._orphan_s)
        else:
            self.actors[worker] = self._new_actor(worker, nodes)
        if self._keep_spare:
            self.spare = self._new_spare(nodes)

    def call(self, worker: int, method: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        return Pending(worker, getattr(self.actors[worker], method.__name__).remote(*args, **kwargs))

    def _call_parts(self, worker: int, method: Callable[..., tuple[T, ...]], n: int, *args: Any) -> list[Pending[T]]:
        refs = getattr(self.actors[worker], method.__name__).options(num_returns=n).remote(*args)
        return [Pending(worker, r) for r in refs]

    def ready(self, pending: Sequence[Pending[Any]]) -> bool:
        refs = [p.handle for p in pending]
        done, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(done) == len(refs)

    def gather_each(self, pending: Sequence[Pending[T]]) -> list[T | WorkerLostError]:
        from ray.exceptions import RayActorError

        try:
            return self._ray.get([p.handle for p in pending])  # one wait for all
        except RayActorError:
            out = []
            for p in pending:  # which workers: those whose calls fail so
                try:
                    out.append(self._ray.get(p.handle))
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
            shutdown_ray()
