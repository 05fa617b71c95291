"""A worker's side of a sliding window: expiring objects from the lists, taking refills, and the
changes an expiry makes (each touched result diffed whole against what Redis holds).

With a reserve, each list keeps ``reserve`` neighbours beyond its ``k``, so an expiry mostly
takes the next one from the reserve instead of a refill search (Skype's k-skyband idea,
VLDBJ 2017).

Every expiry time is known when its object arrives, so each list also knows its **deadline**: the
cutoff at which an expiry will leave it short (:meth:`WindowLists.deadlines`). After each batch
the worker announces the deadlines that changed within a horizon past the cutoff (at least
:data:`DUE_HORIZON_MS`; :class:`~knnmon.refills.DueLists`); the coordinator sends the refills with the batch whose cutoff
reaches them, so no call has to ask first. A batch whose expiry leaves a list short that no
refill came for (the coordinator had not seen its announcement: a restart, a cutoff that jumped
past the horizon, a list that changed between batches) is not applied: the worker returns the
short lists and the coordinator sends the batch again with their refills.
"""

from __future__ import annotations


import numpy as np

from knnmon.arrays import members, runs
from knnmon.batch import BatchChanges, ObjectColumns
from knnmon.query import QueryColumns
from knnmon.refills import NEVER, DueLists, Refills
from knnmon.workers.kernels import kth_latest
from knnmon.workers.state import WorkerState

__all__ = ["DUE_HORIZON_MS", "NO_CUTOFF", "WindowLists"]

#: The cutoff before the first expiry (a worker that has seen none is not windowed yet).
NO_CUTOFF = np.iinfo(np.int64).min

#: How far past a batch's cutoff (event-time ms) the deadlines a worker announces reach at least;
#: twice the cutoff's last step when that is more. A cutoff that moves further between two
#: batches finds lists whose deadline was not announced (the batch then goes to the worker twice,
#: the module docstring).
DUE_HORIZON_MS = 60_000


class WindowLists:
    """The window part of a :class:`~knnmon.workers.worker.KnnWorker` (module docstring), over
    its :class:`~knnmon.workers.state.WorkerState`.

    It keeps, between an expiry and the batch's write, the results as Redis holds them
    (``before``), the last cutoff, the queries asked to refill (``needs``, slots) and, without a
    reserve, the details of the objects a refill brought in; and counts the list entries expired
    and the results refilled.
    """

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.before: tuple[np.ndarray, np.ndarray] | None = None  # (slot, handle) results before an expiry
        self.cutoff = NO_CUTOFF  # the last expiry's cutoff
        self.needs = np.empty(0, dtype=np.int64)  # slots an expiry asked to refill, until the refills come
        self.refilled: dict[str, str] = {}  # details (text) of the objects a refill brought in
        self.expired = self.refills = 0
        self.deadline = np.empty(0, dtype=np.int64)  # per slot, epoch ms (:meth:`deadlines`)
        self.announced = np.empty(0, dtype=np.int64)  # per slot, the deadline last announced (NEVER: none)
        self.oldest = np.empty(0, dtype=np.int64)  # per slot, its oldest member's time (NEVER: none)
        self.touched: list[np.ndarray] = []  # slots whose list changed since the last announcement
        self.horizon_ms = DUE_HORIZON_MS  # how far past the cutoff deadlines are announced

    def renumber(self, keep: np.ndarray) -> None:
        """The live slots ``keep`` (``(m,)`` int64, sorted) become ``0..m-1`` (a compaction)."""
        self.needs = np.searchsorted(keep, self.needs[np.isin(self.needs, keep)])
        self.touched = [np.searchsorted(keep, x[np.isin(x, keep)]) for x in self.touched]
        self.deadline = self.deadline[keep[keep < len(self.deadline)]]  # (the rest are computed anew)
        self.announced = self.announced[keep[keep < len(self.announced)]]
        self.oldest = self.oldest[keep[keep < len(self.oldest)]]

    def deadlines(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(m,)`` int64 each: ``slots``' deadlines and their oldest members' times, epoch ms.
        A deadline is the smallest cutoff at which :meth:`expire` asks to refill the list. With
        ``W`` its members strictly within ``r_q``: the ``k``-th largest time in ``W`` when ``W``
        holds ``k``, else its oldest member's time (the first expiry that touches it);
        :data:`~knnmon.refills.NEVER` without a finite ``r_q`` or a member. O(sum of k + reserve)
        over ``slots``."""
        q, L = self.state.queries, self.state.lists
        c = L.count[slots]
        at = L.places(slots, c)
        inw = L.d[at] < np.repeat(q.radius[slots], c)
        kth, oldest = kth_latest(self.state.handles.t[L.h[at]], inw, np.cumsum(c) - c, c, q.k[slots].astype(np.int64),
                                 NEVER)
        out = np.where(kth != NEVER, kth, oldest)
        out[~np.isfinite(q.radius[slots])] = NEVER
        return out, oldest

    def announce(self) -> DueLists:
        """The deadlines that changed within :attr:`horizon_ms` of the last cutoff, or left it,
        since the last call (:class:`~knnmon.refills.DueLists`): computed anew for the
        lists changed since, and for slots new since."""
        q = self.state.queries
        n, had = len(q.k), len(self.deadline)
        if had < n:
            self.deadline, self.announced, self.oldest = (
                np.concatenate([a, np.full(n - len(a), NEVER, dtype=np.int64)])
                for a in (self.deadline, self.announced, self.oldest))
        touched = np.unique(np.concatenate([np.arange(had, n), *self.touched])).astype(np.int64)
        self.touched = []
        live = touched[q.alive[touched]]
        self.deadline[touched] = self.oldest[touched] = NEVER
        self.deadline[live], self.oldest[live] = self.deadlines(live)
        limit = self.cutoff + self.horizon_ms if self.cutoff > NO_CUTOFF else NEVER
        want = np.where(self.deadline <= limit, self.deadline, NEVER)
        diff = np.flatnonzero(want != self.announced)
        self.announced[diff] = want[diff]
        return DueLists(q.columns(diff, q.cap), want[diff].copy())

    def unmet(self, refilled: np.ndarray) -> np.ndarray:
        """The live slots :meth:`expire` asked to refill that ``refilled`` (slots) does not hold
        (a query dropped since it was asked for needs nothing: its id names no slot now)."""
        return np.setdiff1d(self.needs[self.state.queries.alive[self.needs]], refilled)

    def expire(self, cutoff: int) -> QueryColumns:
        """Remove the objects with ``t <= cutoff`` (epoch ms) from every list held here.

        Every live matching object strictly within a query's ``r_q`` is in its list (``r_q`` is
        the list's last distance when it was last full, ``inf`` if it never was). So a list that
        lost objects still starts with the exact kNN if at least ``k`` of what is left lie
        strictly within ``r_q`` (objects tied at exactly ``r_q`` may be missing); otherwise the
        query is returned, to be refilled with its exact ``k + reserve`` nearest over the live
        objects (:meth:`process_batch`'s ``refills``). A list with ``r_q = inf`` held every
        matching live object and just shrinks. The results as they were are kept until the
        batch's write, which sends each changed result's whole difference (``left`` and
        ``entered``). The queries to refill are kept until the batch's refills come, and
        returned again by every call before that (a call with a cutoff not larger changes
        nothing else): a service that died between the two calls leaves them for the next one
        (:mod:`~knnmon.workers.kept_state`). O(sum of k + reserve) per call.

        Returns
        -------
        QueryColumns
            The queries to refill, ``k`` holding the neighbours to search (``k + reserve``).
        """
        pending = self.state.queries.columns(self.needs, self.state.queries.cap)  # (asked for before, not yet refilled)
        if cutoff <= self.cutoff:
            return pending
        before, self.cutoff = self.cutoff, int(cutoff)
        if before > NO_CUTOFF:
            self.horizon_ms = max(DUE_HORIZON_MS, 2 * (self.cutoff - before))
        n = len(self.state.handles)
        t = self.state.handles.t[:n]
        dead = t <= cutoff
        if not n or not dead.any():
            return pending
        gone = np.flatnonzero(dead & (t > before))
        self.state.handles.forget(gone)
        if self.state.details is not None:
            self.state.details.drop(gone)
        q, L = self.state.queries, self.state.lists
        cand = np.unique(np.concatenate([np.flatnonzero(self.oldest <= cutoff),
                                         np.arange(len(self.oldest), len(q.k)), *self.touched])).astype(np.int64)
        at = L.places(cand, L.count[cand])  # (only lists whose oldest member may have expired)
        places = at[dead[L.h[at]]]
        hit = np.zeros(len(L.h), dtype=bool)
        hit[places] = True
        if not len(places):
            return pending
        self.expired += len(places)
        of = np.searchsorted(L.ptr, places, side="right") - 1
        slots = np.unique(of)
        self.touched.append(slots)
        # Results that lost an entry (not only their reserve): diffed at the write, re-sorted.
        in_res = np.unique(of[places - L.ptr[of] < np.minimum(L.count[of], q.k[of])])
        n_res = np.minimum(L.count[in_res], q.k[in_res])
        res_slot, res_h = np.repeat(in_res, n_res), L.h[L.places(in_res, n_res)]
        if self.before is None:
            self.before = (res_slot, res_h)
        else:  # a second expiry before the write: the first one's results are what Redis holds
            seen = members(res_slot, self.before[0])
            self.before = tuple(np.concatenate([b, x[~seen]]) for b, x in zip(self.before, (res_slot, res_h)))
        c = L.count[slots]
        at = L.places(slots, c)
        keep = ~hit[at]
        s_keep, h_keep, d_keep = np.repeat(slots, c)[keep], L.h[at][keep], L.d[at][keep]
        whole = L.places(slots, q.cap[slots])
        L.d[whole], L.h[whole] = np.inf, -1
        pos = np.arange(len(s_keep)) - np.searchsorted(s_keep, s_keep, side="left")
        L.d[L.ptr[s_keep] + pos], L.h[L.ptr[s_keep] + pos] = d_keep, h_keep
        L.count[slots] = np.bincount(np.searchsorted(slots, s_keep), minlength=len(slots))
        if self.state.settings.reserve and len(in_res):  # ties now straddling the k-th place decide by id
            kk = q.k[in_res]
            over = np.flatnonzero(L.count[in_res] > kk)
            at = L.ptr[in_res[over]] + kk[over]
            tied = in_res[over[L.d[at - 1] == L.d[at]]]
            if len(tied):
                self.sort_lists(tied)
        # Exact still iff k of what is left lie strictly within r_q (the docstring above).
        r = q.radius[s_keep]
        below = np.bincount(np.searchsorted(slots, s_keep[d_keep < r]), minlength=len(slots))
        need = slots[np.isfinite(q.radius[slots]) & (below < q.k[slots])]
        self.needs = np.union1d(self.needs, need)
        return q.columns(self.needs, q.cap)

    def sort_lists(self, slots: np.ndarray) -> None:
        """Order the held entries of ``slots`` by (distance, object id) in place."""
        L, oids = self.state.lists, self.state.handles.ids
        c = L.count[slots]
        at = L.places(slots, c)
        S, D, H = np.repeat(slots, c), L.d[at], L.h[at]
        key = self.state.handles.key[H]
        order = np.lexsort((key, D, S))
        S, D, H, key = S[order], D[order], H[order], key[order]
        same = (S[1:] == S[:-1]) & (D[1:] == D[:-1]) & (key[1:] == key[:-1])
        if same.any():  # shared 8-byte prefixes: those queries' lists by the ids themselves
            for j in np.unique(S[1:][same]).tolist():
                run = np.flatnonzero(S == j)
                by = sorted(run.tolist(), key=lambda i: (D[i], oids[H[i]]))
                D[run], H[run] = D[by], H[by]
        L.d[at], L.h[at] = D, H

    def refill(self, refills: Refills) -> np.ndarray:
        """Replace the results of :meth:`expire`'s queries with their exact kNN over the live
        objects; ``r_q`` grows back (the query is re-indexed with its larger region). Each list
        of ``refills.topk`` comes nearest first, ties by object id (as
        :meth:`~knnmon.coordinator.runtime.object_store.ObjectStore.knn_v` returns them); its
        first ``k + reserve`` are kept. A list searched for a query this worker no longer holds
        as it was searched (unregistered, or registered again with other parameters since its
        deadline was announced) is left out: an expiry that needs it asks again. In columns: no
        Python step per query. Returns the slots refilled (``(m,)`` int64)."""
        q, L, top = self.state.queries, self.state.lists, refills.topk
        slots = q.slots(list(refills.qids))
        sel = np.flatnonzero(slots >= 0)  # (a query unregistered meanwhile has none)
        sel = sel[q.same(slots[sel], refills.queries.take(sel))]
        if not len(sel):
            return slots[sel]
        slots = slots[sel]
        cap = q.cap[slots].astype(np.int64)
        n = np.minimum(top.counts[sel], cap)
        src = runs(np.cumsum(top.counts)[sel] - top.counts[sel], n)  # the kept entries of topk
        clear = L.places(slots, cap)
        L.d[clear], L.h[clear] = np.inf, -1
        places = L.places(slots, n)
        dists = top.dist[src]
        L.d[places] = dists
        objects = refills.objects  # (each entry's row there: every object's handle at once, by row)
        by_row = self.state.handles.handles_of(objects.ids, objects.t)
        L.h[places] = by_row[top.rows[src]]
        L.count[slots] = n
        self.touched.append(slots)
        self.announced[slots[slots < len(self.announced)]] = NEVER  # (the coordinator took them off its list)
        radii = np.full(len(slots), np.inf)
        full = np.flatnonzero(n == cap)
        radii[full] = dists[np.cumsum(n)[full] - 1]
        q.set_radius(slots, radii)
        if self.state.details is not None:  # (the texts of the objects held already are kept)
            new = np.flatnonzero(self.state.details.missing(by_row))
            self.state.details.keep(by_row[new], objects.take(new).texts())
        else:
            self.refilled.update(zip(objects.ids, objects.texts()))
        self.state.handles.key_new()
        self.state.refresh(slots)
        self.refills += len(slots)
        return slots

    def changes(self, batch: ObjectColumns, m) -> tuple[BatchChanges, np.ndarray]:
        """The batch's changes when an expiry touched results or a reserve is kept: each touched
        or changed result's difference to what Redis holds (before the expiry, or before the
        merge ``m`` of the ``batch``'s objects, a :class:`~knnmon.workers.batch_update.Merge` or
        ``None``), as :class:`BatchChanges`, and the sorted slots written."""
        q, L = self.state.queries, self.state.lists
        none = np.empty(0, dtype=np.int64)
        old_slot, old_h = self.before if self.before is not None else (none, none)
        touched = np.unique(old_slot)
        merged = m.in_result if m is not None else none
        if len(merged):
            b_slot, b_h = m.before
            fresh = np.zeros(len(q.k), dtype=bool)
            fresh[merged] = True
            fresh[touched] = False  # an expired result's 'before' is the expiry's
            fresh = fresh[b_slot]
            old_slot, old_h = np.concatenate([old_slot, b_slot[fresh]]), np.concatenate([old_h, b_h[fresh]])
        slots = np.union1d(touched, merged)
        c = np.minimum(L.count[slots], q.k[slots])
        at = L.places(slots, c)
        new_slot, new_h, new_d = np.repeat(slots, c), L.h[at], L.d[at]
        ko, kn = (old_slot << 32) | old_h, (new_slot << 32) | new_h
        ent, left = ~members(kn, ko), ~members(ko, kn)
        changed = np.union1d(new_slot[ent], old_slot[left])
        order = np.argsort(old_slot[left], kind="stable")

        def texts(oids: list[str]) -> list[str | None]:
            if self.state.details is not None:  # (every object that entered a list is kept there: apply, refill)
                return self.state.details.get(oids)
            return [self.refilled.get(o) if x is None else x for o, x in zip(oids, batch.texts(oids))]

        changes = self.state.batch_changes(changed, new_slot[ent], new_h[ent], new_d[ent], old_slot[left][order],
                                           old_h[left][order], texts)
        self.before, self.refilled = None, {}
        return changes, changed
