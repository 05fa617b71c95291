"""A worker's side of re-balancing: report each query's load, hand queries over, take them.

A move happens at a batch boundary, in three calls the coordinator makes in this order, with no
batch dispatched in between (:mod:`knnmon.coordinator.rebalance.migration`):

1. the source's :meth:`Handover.export_queries`: the moving queries with their kept places
   (kNN and reserve), their result as written, their objects' details and recent load; the
   source forgets them (a Ray actor runs the call after every batch sent to it before, so the
   state handed over includes them);
2. the target's :meth:`Handover.adopt_queries`: it takes them from the next batch on; in Redis
   their query hashes' ``worker`` and ``objects`` fields name it, and its details hash gets
   their objects' details (results themselves do not change: nothing enters the change feed);
3. the source's :meth:`Handover.release_handed`: its details hash lets go of the objects no
   query left on it holds.

Results never lose details in between (the target's are written before the source's go).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from knnmon.batch import KnnColumns, ObjectColumns, ObjectInfo, QueryHandover
from knnmon.workers.holders import texts_of
from knnmon.workers.registration import Registration
from knnmon.workers.state import WorkerState

__all__ = ["Handover"]


class Handover:
    """The re-balancing part of a :class:`~knnmon.workers.worker.KnnWorker` (module docstring),
    over its :class:`~knnmon.workers.state.WorkerState`; queries leave and arrive through its
    ``registration``. It keeps the queries handed over and not yet released (``handed``)."""

    def __init__(self, state: WorkerState, registration: Registration) -> None:
        self.state, self.registration = state, registration
        self.handed: list[tuple[str, list[str]]] = []  # (query, members) exported, not yet released

    def query_loads(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The registered queries' ids, their recent measured loads ``(m,)`` float64
        (microseconds of busy time, decayed: :mod:`knnmon.workers.query_load`) and their
        positions, lon and lat ``(m,)`` float64 degrees (a re-plan spreads a set in space order)."""
        live = np.flatnonzero(self.state.queries.alive)
        self.state.load.extend(len(self.state.queries))
        q = self.state.queries
        return q.ids.names(live), self.state.load.us[live].copy(), q.lon[live].copy(), q.lat[live].copy()

    def export_queries(self, qids: Sequence[str]) -> QueryHandover:
        """Hand over the queries of ``qids`` this worker holds (others are skipped) and forget
        them; their details hash entries stay until :meth:`release_handed`.

        Returns
        -------
        QueryHandover
            Ids in ``qids``' order.
        """
        t0 = time.perf_counter()
        found = self.state.queries.slots(qids)
        held = [q for q, s in zip(qids, found.tolist()) if s >= 0]
        slots = found[found >= 0]
        L = self.state.lists
        n = L.count[slots]
        at = L.places(slots, n)  # every kept place (the kNN and, with a reserve, beyond), nearest first
        topk = KnnColumns(n, self.state.handles.names(L.h[at]), L.d[at].copy())
        members = topk.firsts(self.state.queries.k[slots])
        st = self.state
        if st.details is not None:  # a reserve: every kept object's details are in memory
            wanted = np.unique(L.h[at])
            objects = ObjectColumns.of_infos({o: ObjectInfo.from_text(x) for o, x in
                                              zip(st.handles.names(wanted), st.details.of_handles(wanted))
                                              if x is not None})
        elif st.writer is not None:
            objects = ObjectColumns.of_infos(st.write_now(st.writer.read_details, list(zip(held, members))))
        else:
            objects = ObjectColumns.of_infos({})
        columns = self.state.queries.columns(slots)
        loads = self.state.load.us[slots].copy() if len(slots) else np.zeros(0)
        radii = self.state.queries.radius[slots].copy()
        codes = self.state.vocabulary.codes
        vocabulary = {w: codes[w] for kws in columns.keywords for w in kws if w in codes}
        self.registration.drop(held)
        self.handed += list(zip(held, members))
        return QueryHandover(columns, topk, objects, loads, radii, vocabulary, time.perf_counter() - t0)

    def export_parts(self, parts: Sequence[Sequence[str]]) -> tuple[QueryHandover, ...]:
        """:meth:`export_queries` of every part's queries at once (a move's queries for several
        targets: one pass, not one per target); one handover per part, in order, each with its
        share of the export's seconds."""
        return tuple(self.export_queries([q for part in parts for q in part]).split(parts))

    def adopt_queries(self, handover: QueryHandover, vocabulary: Mapping[str, int] | None = None,
                      note: Mapping[str, str] | None = None) -> tuple[int, float]:
        """Take queries another worker handed over (:meth:`export_queries`); they are
        candidates from the next batch on. ``vocabulary``: their keywords' codes, as the
        coordinator encodes batches (default: the handover's own, the source's codes); ``note``:
        more fields for their query hashes (why they moved). Returns how many, and the seconds
        it took.

        Raises
        ------
        InvalidQueryError
            An id this worker holds already.
        """
        t0 = time.perf_counter()
        self.state.vocabulary.learn(vocabulary if vocabulary is not None else handover.vocabulary)
        slots = self.registration.append(handover.queries, handover.topk, handover.objects)
        self.state.load.us[slots.start:slots.stop] = np.asarray(handover.loads, dtype=np.float64)
        # The source's r_q, not one made from the list: with a window a list short of its
        # k + reserve places (expired) still has a finite radius (the next refill is due at it).
        self.state.queries.set_radius(np.arange(slots.start, slots.stop), np.asarray(handover.radii, dtype=np.float64))
        if self.state.writer is not None and len(slots):
            r_slot, r_h, _ = self.state.results_of(np.arange(slots.start, slots.stop))
            known = np.fromiter((o in handover.objects for o in self.state.handles.names(r_h)), dtype=bool,
                                count=len(r_h))  # (details missing: not held)
            none = np.empty(0, dtype=np.int64)
            dets = self.state.held(r_slot[known], r_h[known], none, none, texts_of(handover.objects))
            self.state.write_now(self.state.writer.adopt_queries, self.state.next_tag(),
                                 list(zip(handover.queries.ids, handover.members)), handover.objects, note, dets)
        self.state.refresh(np.arange(slots.start, slots.stop))
        return len(slots), time.perf_counter() - t0

    def regions_with(self, keywords: Sequence[str]) -> tuple[np.ndarray, ...]:
        """The live queries holding any of ``keywords``, with their kNN radii: what the routing
        table must still cover for this worker under those keywords once queries left it (a
        move's source narrows its routing entries to these, :mod:`~knnmon.coordinator.rebalance.migration`).

        Returns
        -------
        lon, lat : ``(m,)`` float64 degrees
        radius : ``(m,)`` float64 meters (``inf`` below ``k`` + reserve places)
        pair_query : ``(p,)`` int64, the row in ``m`` of each (query, keyword) pair
        pair_keyword : ``(p,)`` int64, the pair's keyword as an index into ``keywords``
        """
        codes = self.state.vocabulary.codes
        want = np.fromiter((codes.get(w, -1) for w in keywords), dtype=np.int64, count=len(keywords))
        index = np.full(max(self.state.vocabulary.next_code, 1), -1, dtype=np.int64)
        ok = want >= 0
        index[want[ok]] = np.flatnonzero(ok)
        slot, code = self.state.queries.entries(np.flatnonzero(self.state.queries.alive))
        asked = index[code] if len(code) else np.empty(0, dtype=np.int64)
        slot, asked = slot[asked >= 0], asked[asked >= 0]
        rows, pair_query = np.unique(slot, return_inverse=True)
        q = self.state.queries
        return q.lon[rows].copy(), q.lat[rows].copy(), q.radius[rows].copy(), pair_query.astype(np.int64), asked

    def release_handed(self) -> int:
        """Let go, in this worker's details hash, of the objects only the queries handed over
        since the last call held; returns how many queries."""
        handed, self.handed = self.handed, []
        if self.state.writer is not None and handed:
            sizes = np.fromiter((len(m) for _, m in handed), dtype=np.int64, count=len(handed))
            # (every one still has its handle: a compaction keeps what a written result holds)
            l_h = self.state.handles.lookup([o for _, members in handed for o in members])
            l_q, none = np.repeat(np.arange(len(handed)), sizes), np.empty(0, dtype=np.int64)
            l_q, l_h = l_q[l_h >= 0], l_h[l_h >= 0]
            dets = self.state.held(none, none, l_q, l_h, texts_of({}), qids=[q for q, _ in handed])
            self.state.write_now(self.state.writer.release_queries, self.state.next_tag(), handed, dets)
        return len(handed)
