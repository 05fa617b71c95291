"""Query operations of ``knnmon serve``: register, update, unregister, decided in stream order.

- A register of a new id registers it (consecutive registrations go to the runtime in one
  vectorised call).
- A register of an id that exists with other parameters is an **update**: unregister, then
  register (a new result whose version restarts at 0); counted as ``updated``. With the same
  parameters it is a no-op (``unchanged``: a retried client, or an operation applied again after
  a restart).
- An unregister of an unknown id is a no-op, counted as ``unregister_unknown``.
- A malformed entry is rejected with its reason (:func:`~knnmon.protocol.parse_query_op`).
"""

from __future__ import annotations

from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.service.intake import Entry, Reject
from knnmon.errors import Rejected
from knnmon.limits import Limits
from knnmon.protocol import parse_query_op
from knnmon.query import Query

__all__ = ["QueryOps"]


class QueryOps:
    """The registered queries and the register / update / unregister rule (module docstring).

    Attributes
    ----------
    queries : dict of str to Query
        Every registered query.
    counters : dict of str to int
        ``registered``, ``updated``, ``unchanged``, ``unregistered``, ``unregister_unknown``
        are added to (the service's counters).
    """

    def __init__(self, queries: dict[str, Query], limits: Limits, counters: dict[str, int]) -> None:
        self.queries = queries
        self.limits = limits
        self.counters = counters

    def apply(self, entries: list[Entry], runtime: Runtime) -> list[Reject]:
        """Apply query operations in order; returns the rejected entries."""
        rejects: list[Reject] = []
        batch: list[Query] = []  # consecutive registrations
        queued: set[str] = set()  # their ids

        def flush() -> None:
            if not batch:
                return
            runtime.register(list(batch))
            for q in batch:
                self.queries[q.id] = q
            self.counters["registered"] += len(batch)
            batch.clear()
            queued.clear()

        for eid, fields in entries:
            try:
                op = parse_query_op(fields, self.limits)
            except Rejected as r:
                rejects.append((eid, fields, r))
                continue
            if op.op == "unregister" or op.id in queued:
                flush()
            if op.op == "unregister":
                self.queries.pop(op.id, None)
                self.counters["unregistered" if runtime.unregister(op.id) else "unregister_unknown"] += 1
                continue
            if runtime.holds(op.id):
                if self.queries.get(op.id) == op.query:
                    self.counters["unchanged"] += 1
                    continue
                runtime.unregister(op.id)
                self.counters["updated"] += 1
            batch.append(op.query)
            queued.add(op.id)
        flush()
        return rejects
