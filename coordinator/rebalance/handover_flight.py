"""Moving queries while batches go on: the hand-over in flight (Ray actors, batches in flight).

:func:`~.migration.migrate` waits at the move's batch boundary for the sources' exports and
then the targets' adoptions: two Ray round trips, each behind every batch already queued on
those workers. Here the dispatch waits for neither:

1. at the move's boundary, :func:`send_moves` sends each source one ``export_parts`` (one
   export per source, one result per move) and each move's target ``adopt_queries`` of its
   part's object ref
   (with Ray actors the object ref is the adoption's argument: Ray hands the export to the
   target, not through the coordinator). The registrar's query -> worker map switches at
   once, and the routing table forwards to the target every object it routes to the source
   (:meth:`~knnmon.coordinator.live_routing.LiveRouting.forward`);
2. at a later boundary, once every export and adoption answered (:meth:`MovesInFlight.ready`),
   :meth:`MovesInFlight.land`: the routing table learns each moved query's region for its
   target (from the export: the radius its source held), the forwarding stops, and the sources
   are sent their release (:class:`~.migration.Release`, finished at a later boundary still).

**Exactness**, as :func:`~.migration.migrate`'s. A Ray actor runs one submitter's calls in the
order they were sent, an argument's object ref included (the adoption, and every call sent to
the target after it, waits for the export). So the source's export follows every batch sent to it
before the move (the state handed over includes them), and the target's adoption follows every
batch sent to it before (routed while the queries were the source's: it ignored them for these
queries) and precedes every batch sent after. A batch routed between the move and the landing
reaches the target wherever it reaches the source: the source's entries still cover the moved
queries' regions (the table routes a superset at every moment, and the source is not narrowed
before the landing), so the target receives every object the moved queries need. From the
landing on, the target's own entries route them. With a window, the watermark's expiry call
reaches the source after its export and the target after its adoption, so a moved query's
refill is asked of, and sent to, the target.

**Costs.** Until the landing the target receives the source's objects too (one or two batches);
the exports and adoptions run in the workers beside their batches. A worker lost meanwhile fails
the batch that reaches it (``knnmon run`` stops, as with any loss with batches in flight); the
re-balancer takes this path only with batches in flight. With none (``knnmon serve``, one batch
at a time) :func:`~.migration.migrate` waits and revives a lost worker in place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from knnmon.coordinator.rebalance.migration import Moved, Release, route_targets, send_release
from knnmon.coordinator.rebalance.planner import Move
from knnmon.coordinator.runtime.registration import Registrar
from knnmon.coordinator.runtime.worker_pool import Pending, WorkerPool
from knnmon.errors import WorkerLostError

__all__ = ["MovesInFlight", "send_moves"]


def send_moves(pool: WorkerPool, registrar: Registrar, moves: Sequence[Move],
               note: Mapping[str, str] | None = None) -> MovesInFlight:
    """Start ``moves`` (module docstring, 1): each move's queries that its source holds (as the
    registrar knows: a query unregistered since the plan is skipped) are handed over, the
    registrar switched, the routing table forwarding. ``note``: fields for each moved query's
    hash (when and why it moved), besides ``moved_from``."""
    t0 = time.perf_counter()
    where, routing = registrar.query_worker, registrar.plan.routing
    sent: list[tuple[Move, Pending, Pending]] = []
    queries = 0
    by_source: dict[int, list[tuple[Move, list[str]]]] = {}
    for m in moves:
        mine = [q for q in m.qids if where.get(q) == m.source]
        if mine:
            by_source.setdefault(m.source, []).append((m, mine))
    for source, parts in sorted(by_source.items()):  # one export per source, one adoption per move
        exported = pool.export_parts(source, [mine for _, mine in parts])
        # (with Ray actors the export's object ref is the adoption's argument: the target's call
        # waits for it in Ray, not here, and runs in order with the target's other calls)
        calls = [(e, pool.adopt(m.target, e.handle, None, {**(note or {}), "moved_from": str(source)}))
                 for e, (m, _) in zip(exported, parts)]
        for (m, mine), (exported, adopted) in zip(parts, calls):
            sent.append((m, exported, adopted))
            routing.forward(m.source, m.target)
            for q in mine:
                where[q] = m.target
            registrar.worker_queries[m.source] -= len(mine)
            registrar.worker_queries[m.target] += len(mine)
            queries += len(mine)
    return MovesInFlight(sent, queries, time.perf_counter() - t0)


class MovesInFlight:
    """Moves sent by :func:`send_moves`, not yet landed (module docstring).

    Attributes
    ----------
    queries : int
        Queries handed over (as sent; once landed, as the sources exported them).
    send_seconds : float
        The dispatch's wait at the move's boundary (sending the calls, the switch).
    """

    def __init__(self, sent: list[tuple[Move, Pending, Pending]], queries: int, send_seconds: float) -> None:
        self.sent, self.queries, self.send_seconds = sent, queries, send_seconds
        self.pending = [p for _, e, a in sent for p in (e, a)]  # (export, adoption) per move
        self.started = time.perf_counter()

    def ready(self, pool: WorkerPool) -> bool:
        """Whether every export and adoption answered (:meth:`land` would not wait)."""
        return pool.ready(self.pending)

    def land(self, pool: WorkerPool, registrar: Registrar) -> Moved:
        """Route the moved queries to their targets, stop forwarding, send the sources' release
        (module docstring, 2); returns what it did (its phases: ``send``, ``flight`` from the
        send to this landing, ``export`` and ``adopt`` the workers' time, ``land``).

        Raises
        ------
        WorkerLostError
            A source or target died before it answered.
        """
        t0 = time.perf_counter()
        out = pool.gather_each(self.pending)
        lost = next((x for x in out if isinstance(x, Exception)), None)
        if lost is not None:  # (the moved queries' state cannot be told: stop, as a loss with batches in flight)
            m = self.sent[out.index(lost) // 2][0]
            raise WorkerLostError(getattr(lost, "worker", m.target),
                                  f"lost during a hand-over in flight (queries moving from worker {m.source} to "
                                  f"worker {m.target}): {lost}") from lost
        exports, adoptions = out[0::2], out[1::2]
        handed = [(m, h) for (m, _, _), h in zip(self.sent, exports)]
        route_targets(registrar, [(m.target, h) for m, h in handed])
        registrar.plan.routing.stop_forwarding([(m.source, m.target) for m, _ in handed])
        release: Release = send_release(pool, [(m.source, h) for m, h in handed])[1]
        self.queries = sum(len(h) for _, h in handed)
        t1 = time.perf_counter()
        phases = {"send": 1e3 * self.send_seconds, "flight": 1e3 * (t0 - self.started),
                  "export": 1e3 * sum(h.seconds for _, h in handed), "adopt": 1e3 * sum(s for _, s in adoptions),
                  "land": 1e3 * (t1 - t0)}
        return Moved(self.queries, t1 - t0, release, {k: round(v, 2) for k, v in phases.items()})
