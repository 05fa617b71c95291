"""What a worker process that outlived its service can tell the next one, so that the next
service keeps the worker's state instead of loading it again from Redis.

A service on a Ray cluster runs its workers as detached actors (:mod:`knnmon.workers.actor`);
when the service dies (SIGKILL), each worker finishes the calls it was sent and waits, its
queries, top-k lists, object handles and keyword codes intact. Its state equals what Redis holds
for its queries when (:meth:`KeptState.kept_state`):

- Redis's marker of the worker (``knn:worker:{w}:batch``) is the value its own last write left
  (``<session>:<tag>``, :meth:`~knnmon.workers.result_writer.ResultWriter.last_write`): each write
  is one script that sets the results, the query hashes, the ``queries`` set, the details hash and
  the marker together, so no other write reached this worker's keys after it;
- no write failed after it, every queued write is done (the call waits for them);
- no query is handed over and not yet released (a re-balancing move cut short).

What it applied beyond that write (a batch that changed none of its results) is a set of
delivered objects that did not enter, which the next service's replay gives again or not
(:mod:`~knnmon.coordinator.recovery.kept_start`): either way the lists stay exact. An expiry whose
batch never came (the service died between the two calls) left shortened lists, the results as
Redis holds them and the queries to refill
(:meth:`~knnmon.workers.window_lists.WindowLists.expire`), which the replay's expiry returns again:
its batch then refills them and writes the whole difference.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

import numpy as np

from knnmon.query import QueryColumns
from knnmon.refills import NEVER
from knnmon.reports import KeptReport
from knnmon.workers.handover import Handover
from knnmon.workers.state import WorkerState
from knnmon.workers.window_lists import WindowLists

__all__ = ["KeptState"]


class KeptState:
    """The kept-start part of a :class:`~knnmon.workers.worker.KnnWorker` (module docstring), over
    its :class:`~knnmon.workers.state.WorkerState`; a move cut short (the ``handover``'s queries
    handed over and not released) makes the state not one to keep."""

    def __init__(self, state: WorkerState, handover: Handover, window: WindowLists) -> None:
        self.state, self.handover, self.window = state, handover, window

    def kept_state(self) -> KeptReport:
        """What this worker says of its state after its queued writes (:class:`KeptReport`)."""
        why = None
        try:
            marker, failed = self.state.last_write()  # (after the queued writes)
        except Exception as ex:  # noqa: BLE001 - a queued write failed: Redis lacks it
            marker, failed = None, True
            why = f"a queued write failed ({type(ex).__name__})"
        if why is None and failed:
            why = "a write failed after its last one"
        elif why is None and self.state.writer is None:
            why = "it writes no results"
        elif why is None and self.handover.handed:
            why = "queries handed over and not released"
        return KeptReport(marker=marker, why=why, queries=int(self.state.queries.alive.sum()), pid=os.getpid(),
                          worker=self.state.worker_id, writes=self.state.writer is not None)

    def kept_queries(self) -> tuple[QueryColumns, np.ndarray, np.ndarray, dict[str, int]]:
        """What the next service needs of the queries held here: their columns (``m`` queries,
        ``k`` each one's own), ``(m,)`` float64 kNN radii ``r_q`` in meters (``inf`` below
        ``k + reserve`` neighbours), ``(m,)`` int64 their results' sizes (at most ``k``), and the
        keyword codes (keyword -> code) batches arrive encoded with."""
        q = self.state.queries
        live = np.flatnonzero(q.alive)
        counts = np.minimum(self.state.lists.count[live], q.k[live]).astype(np.int64)
        return q.columns(live), q.radius[live].copy(), counts, dict(self.state.vocabulary.codes)

    def holds_among(self, oids: Sequence[str]) -> list[str]:
        """The ids among ``oids`` that a list here holds (within ``k`` or in the reserve)."""
        h = self.state.handles.lookup(list(oids))
        held = np.zeros(max(len(self.state.handles), 1), dtype=bool)
        used = self.state.lists.h[self.state.lists.h >= 0]
        held[used] = True
        return [o for o, x in zip(oids, h.tolist()) if x >= 0 and held[x]]

    def keep_for(self) -> int:
        """Become the worker of the next service as it is: its writes carry a new session (a batch
        number of the new service never matches a tag written before), and with a window its
        next announcement gives every deadline within the horizon (the next service has seen none:
        it refills ahead from the first batch on, no batch comes back short); returns the number
        of queries held."""
        if self.state.writer is not None:
            self.state.writer.session = uuid.uuid4().hex[:12]
        self.window.announced[:] = NEVER  # (the next service knows no deadline: announce them all again)
        return int(self.state.queries.alive.sum())
