"""Moving queries between live workers at a batch boundary, exactly.

The coordinator calls this between two dispatches, so no batch is routed while it runs. Batches
dispatched before it may still be in flight; that is safe because a Ray actor runs calls in the
order they were sent:

1. every source's ``export_queries`` (:mod:`knnmon.workers.handover`) runs after the batches
   sent to it before: the top-k, radii and generations it hands over include them;
2. every target's ``adopt_queries`` runs after the batches sent to it before, which were routed
   while the queries were still the source's (so the target, not holding them, ignored them for
   these queries), and before any batch sent after: from the next batch on, the target holds them;
3. the routing table learns each moved query's region for its target, and the registrar's
   query -> worker map switches, both before the next dispatch;
4. every source's ``release_handed`` drops details only the moved queries held, and its
   ``regions_with`` reports the regions of the queries left to it that share a keyword with the
   moved ones: the routing table withdraws the source from every other entry of those keywords
   (:meth:`~knnmon.coordinator.live_routing.LiveRouting.narrow`), so the moved queries' objects stop
   reaching it, with no rebuild of the table. The re-balancer does not wait for this step: it
   narrows at a later batch boundary, once the sources answered (:class:`Release`).

No batch is applied to a moved query twice or missed, and its result in Redis does not change.

**A worker lost during the move** (``revive`` given: no batch in flight) is revived in place
from Redis and its step of the move done again, so the other workers keep their state:

- a source lost before its export returned: the coordinator still counts its queries as its
  own, so the revived source holds them all again and exports them anew;
- a target lost before all its adoptions returned: it is revived with the queries it held
  before the move (the coordinator has not switched the moved ones yet) and adopts every part
  handed to it again, from the exports the coordinator keeps;
- a source lost at the release: it is revived with the queries left to it (the switch is made);
  details its old process would have let go of may stay in its details hash (never fewer).

Without ``revive`` (``knnmon run`` with batches in flight) the loss is raised as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from knnmon.assignment.region_entries import region_entries
from knnmon.batch import QueryHandover
from knnmon.coordinator.rebalance.planner import Move
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import WorkerLostError

__all__ = ["Moved", "Release", "gather_reviving", "migrate", "route_targets", "send_release"]

T = TypeVar("T")


def gather_reviving(pool: WorkerPool, calls: Sequence[tuple[int, Callable[[], Pending[T]]]],
                    revive: Callable[[int], bool] | None, sent: Sequence[Pending[T]] | None = None) -> list[T]:
    """The results of ``calls`` (``(worker, make the call)``, in order; ``sent``: made already);
    a worker lost in any of its calls is revived (``revive(worker)``: ``True`` once revived) and
    every call of its made again, in order, on the new actor (a revived worker is in the state
    the coordinator knows, without what its lost calls did).

    Raises
    ------
    WorkerLostError
        A worker was lost and ``revive`` is ``None`` or cannot revive it, or it was lost again.
    """
    out = pool.gather_each(list(sent) if sent is not None else [call() for _, call in calls])
    lost = sorted({w for (w, _), x in zip(calls, out) if isinstance(x, WorkerLostError)})
    for w in lost:
        first = next(x for (v, _), x in zip(calls, out) if v == w and isinstance(x, WorkerLostError))
        if revive is None or not revive(w):
            raise first
        again = [i for i, (v, _) in enumerate(calls) if v == w]
        for i, x in zip(again, pool.gather([calls[i][1]() for i in again])):
            out[i] = x
    return out


@dataclass(frozen=True)
class Moved:
    """What a move did (:func:`migrate`, :meth:`~knnmon.coordinator.rebalance.handover_flight.MovesInFlight.land`).

    Attributes
    ----------
    queries : int
        Queries moved.
    seconds : float
        The move's wall time (landing one in flight: the landing's).
    release : Release
        The sources' release, sent.
    phases_ms : dict of str to float
        Each phase's ms: :func:`migrate`'s ``export``, ``adopt``, ``route`` (the switch and the
        targets' regions added while the sources release) and ``release`` (waiting for them and
        narrowing, 0 when deferred); a landing's ``send``, ``flight``, ``export``, ``adopt``,
        ``land``.
    entries_narrowed : int or None
        Routing entries the sources were withdrawn from (``None``: the release is deferred).
    """

    queries: int
    seconds: float
    release: Release
    phases_ms: dict[str, float]
    entries_narrowed: int | None = None


def migrate(pool: WorkerPool, registrar: Registrar, moves: Sequence[Move], *, note: dict[str, str] | None = None,
            revive: Callable[[int], bool] | None = None, defer_release: bool = False) -> Moved:
    """Carry out ``moves`` (module docstring; :class:`Moved`). ``defer_release``: do not wait
    for the sources' release; the caller finishes it (:class:`Release`) at a later batch
    boundary.

    Each moved query's region is routed to its target at the radius its source held (as at
    registration: its ``k + reserve``-th place's, while it has them). ``note``: fields written into
    each moved query's hash (when and why it moved, for ``knnmon explain``), besides ``moved_from``
    (its source worker).
    ``revive``: revives a lost worker in place (module docstring), ``True`` if it did; only
    with no batch in flight.

    Raises
    ------
    WorkerLostError
        A worker died during the move and was not revived (``knnmon serve`` recovers from
        Redis; ``knnmon run`` stops).
    """
    t0 = time.perf_counter()
    by_source: dict[int, list[Move]] = {}
    for m in moves:
        if m.qids:
            by_source.setdefault(m.source, []).append(m)
    sources = sorted(by_source)
    exports = gather_reviving(pool, [(s, lambda s=s: pool.export(s, [q for m in by_source[s] for q in m.qids]))
                                     for s in sources], revive)
    routing = registrar.plan.routing
    adopts, parts = [], []
    for s, h in zip(sources, exports):
        for m, part in zip(by_source[s], h.split([m.qids for m in by_source[s]])):
            if not len(part):
                continue
            vocabulary = {x: routing.code(x) for kws in part.queries.keywords for x in kws}
            adopts.append((m.target, lambda m=m, part=part, vocabulary=vocabulary: pool.adopt(
                m.target, part, vocabulary, {**(note or {}), "moved_from": str(m.source)})))
            parts.append((m, part))
    t1 = time.perf_counter()
    gather_reviving(pool, adopts, revive)
    t2 = time.perf_counter()
    moved = 0
    for m, part in parts:  # the switch, then the sources' release while the routing table learns
        for qid in part.queries.ids:
            registrar.query_worker[qid] = m.target
        registrar.worker_queries[m.source] -= len(part)
        registrar.worker_queries[m.target] += len(part)
        moved += len(part)
    calls, release = send_release(pool, [(m.source, part) for m, part in parts])
    route_targets(registrar, [(m.target, part) for m, part in parts])
    t3 = time.perf_counter()
    narrowed = None
    if not defer_release:
        narrowed = release.finish(pool, registrar, lambda: gather_reviving(pool, calls, revive, release.sent))
    t4 = time.perf_counter()
    phases = {"export": t1 - t0, "adopt": t2 - t1, "route": t3 - t2, "release": t4 - t3}
    return Moved(moved, t4 - t0, release, {k: round(1e3 * v, 2) for k, v in phases.items()}, narrowed)


def send_release(pool: WorkerPool, handed: Sequence[tuple[int, QueryHandover]]):
    """Send each source of ``handed`` (``(source, what it exported)``) its ``release_handed``
    and ``regions_with`` of the keywords of the queries that left it; returns ``(calls,
    release)``: ``(worker, make the call)`` per call, and the :class:`Release` of the calls sent."""
    moved_words: dict[int, set[str]] = {}
    for source, part in handed:
        moved_words.setdefault(source, set()).update(x for kws in part.queries.keywords for x in kws)
    words = {s: sorted(ws) for s, ws in moved_words.items()}
    calls = [c for s in sorted(words) for c in ((s, lambda s=s: pool.release_handed(s)),
                                                (s, lambda s=s: pool.regions_with(s, words[s])))]
    return calls, Release(sorted(words), words, [call() for _, call in calls])


def route_targets(registrar: Registrar, adopted: Sequence[tuple[int, QueryHandover]]) -> None:
    """Add each moved query's region to the routing table for the worker that adopted it
    (``adopted``: ``(target, the handover)``), at the radius its source held."""
    routing, model = registrar.plan.routing, registrar.plan.model
    for target, part in adopted:
        q = part.queries
        radius = np.asarray(part.radii, dtype=np.float64)  # the source's r_q (its region routed)
        rect = model.rects(np.asarray(q.lon, dtype=np.float64), np.asarray(q.lat, dtype=np.float64), radius)
        routing.add_many([[routing.code(x) for x in kws] for kws in q.keywords], rect.x0, rect.y0, rect.x1, rect.y1,
                         np.full(len(q.ids), target))


class Release:
    """The sources' last step of a move (module docstring, 4): their ``release_handed`` and
    ``regions_with`` calls, sent; :meth:`finish` narrows the routing table from their answers.
    Deferred (``migrate(defer_release=True)``), it is finished at a later batch boundary, once
    :meth:`ready`: until then the sources keep their entries (more deliveries, never a lost
    one), and a source lost meanwhile is found, and revived, by the batch that reaches it."""

    def __init__(self, sources: list[int], words: dict[int, list[str]], sent: list[Pending]) -> None:
        self.sources, self.words, self.sent = sources, words, sent

    def ready(self, pool: WorkerPool) -> bool:
        """Whether the sources answered (:meth:`finish` would not wait)."""
        return pool.ready(self.sent)

    def finish(self, pool: WorkerPool, registrar: Registrar, gather: Callable[[], list[Any]] | None = None) -> int:
        """Narrow the routing table from the sources' answers (``gather``: how to collect them,
        by default each as it is, a lost source's skipped); returns how many entries lost a
        source's bit."""
        answers = (gather or (lambda: pool.gather_each(self.sent)))()[1::2]
        routing, model = registrar.plan.routing, registrar.plan.model
        return sum(_narrow(routing, model, s, self.words[s], regions) for s, regions in zip(self.sources, answers)
                   if not isinstance(regions, Exception))


def _narrow(routing, model, source: int, words: list[str], regions) -> int:
    """Withdraw ``source`` from the routing entries of ``words`` (its moved queries' keywords)
    that none of its remaining queries needs (``regions``: :meth:`KnnWorker.regions_with` of
    them, asked after the move); returns how many entries lost its bit."""
    lon, lat, radius, pair_query, pair_word = regions
    codes = np.array([routing.code(w) for w in words], dtype=np.int64)
    held = np.zeros(len(words), dtype=bool)
    held[pair_word] = True
    keep = np.empty(0, dtype=np.int64)
    if len(pair_query):
        rect = model.rects(lon, lat, radius)
        bit = np.full(len(pair_query), np.uint64(1) << np.uint64(source), dtype=np.uint64)
        keep, _ = region_entries(codes[pair_word], rect.x0[pair_query], rect.y0[pair_query], rect.x1[pair_query],
                                 rect.y1[pair_query], bit, model.grid.n)
    return routing.narrow(source, codes, held, keep)
