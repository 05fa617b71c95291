"""The objects a worker's lists hold, by handle: an int per object id that entered a result here.

The top-k lists (:mod:`knnmon.workers.topk_lists`) store handles, not ids; a handle indexes
``oids`` (the id), ``key`` (its 8-byte order-preserving prefix key,
:func:`knnmon.encoding.id_prefix_keys`, for ties by id in the kernels) and ``t`` (its time, for
a window's expiry). Handles of objects no list holds are released by :meth:`ObjectHandles.compact`.

An id is found by its 64-bit hash (:func:`knnmon.encoding.id_hashes`, as the coordinator's
:mod:`~knnmon.coordinator.runtime.seen_ids` does) in a sorted **run** of the handles' hashes, a
hit confirmed by comparing the ids (two ids with one hash both stay findable); the handles made
since the run was last sealed are in a small dict. No dict entry per held object: 17 bytes per
handle (the run's hash and handle, a flag) where a ``dict`` of ``str`` costs ~100; the hashes are
computed again from the ids when the run is rebuilt (:meth:`ObjectHandles.compact`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.batch import ObjectColumns, ObjectInfo
from knnmon.encoding import id_hashes, id_prefix_keys
from knnmon.workers.vocabulary import own

__all__ = ["NO_TIME", "ObjectHandles", "SEAL"]

#: The time of an object whose time a worker was not told (it never expires).
NO_TIME = np.iinfo(np.int64).max
#: The handles made since the last seal (in a dict) join the sorted run at this many.
SEAL = 1 << 14


class ObjectHandles:
    """Object id <-> handle, with each handle's prefix key and time (module docstring).

    ``key`` and ``t`` are capacity-doubled ``(>= len(self),)`` uint64 and int64 arrays; ``live``
    is the number of handles after the last :meth:`compact` (the worker compacts when the
    handles outgrow it).
    """

    def __init__(self) -> None:
        self.oids: list[str] = []
        self.key = np.zeros(0, dtype=np.uint64)
        self.t = np.zeros(0, dtype=np.int64)
        self._keyed = 0
        self.live = 0
        self._known = np.zeros(0, dtype=bool)  # per handle: findable by its id (not forgotten)
        self._run_hash = np.zeros(0, dtype=np.uint64)  # the sealed handles' hashes, sorted
        self._run_handle = np.zeros(0, dtype=np.int64)  # ... and their handles, in that order
        self._recent: dict[str, int] = {}  # the handles made since the last seal

    def __len__(self) -> int:
        return len(self.oids)

    def lookup(self, oids: Sequence[str]) -> np.ndarray:
        """``(m,)`` int64: each id's handle, ``-1`` for an id with none (never seen, or
        forgotten)."""
        m = len(oids)
        out = np.full(m, -1, dtype=np.int64)
        if not m:
            return out
        recent = self._recent
        if recent:
            out[:] = np.fromiter((recent.get(o, -1) for o in oids), dtype=np.int64, count=m)
        n = len(self._run_hash)
        rest = np.flatnonzero(out < 0)
        if not n or not len(rest):
            return out
        h = id_hashes([oids[j] for j in rest.tolist()])
        pos = np.minimum(np.searchsorted(self._run_hash, h), n - 1)
        hit = np.flatnonzero(self._run_hash[pos] == h)
        first = self._run_handle[pos[hit]]
        names, known = self.oids, self._known
        ok = known[first] & np.fromiter((names[c] == oids[r] for c, r in zip(first.tolist(), rest[hit].tolist())),
                                        dtype=bool, count=len(hit))
        out[rest[hit[ok]]] = first[ok]
        for i in hit[~ok].tolist():  # a forgotten id's or another id's handle first: the others with this hash
            p, oid = int(pos[i]) + 1, oids[int(rest[i])]
            while p < n and self._run_hash[p] == h[i]:
                c = int(self._run_handle[p])
                if known[c] and names[c] == oid:
                    out[rest[i]] = c
                    break
                p += 1
        return out

    def __contains__(self, oid: object) -> bool:
        return isinstance(oid, str) and bool(self.lookup([oid])[0] >= 0)

    def _add(self, names: list[str], times: np.ndarray) -> np.ndarray:
        """New handles for distinct ``names`` not held (times epoch ms): ``(m,)`` int64."""
        first, n = len(self.oids), len(self.oids) + len(names)
        self.oids.extend(names)
        self.t = with_capacity(self.t, n)
        self.t[first:n] = times
        self._known = with_capacity(self._known, n)
        self._known[first:n] = True
        self._recent.update(zip(names, range(first, n)))
        if len(self._recent) >= SEAL:
            self._seal()
        return np.arange(first, n, dtype=np.int64)

    def _seal(self) -> None:
        """The recent handles join the sorted run (by merging, O(run))."""
        new = np.fromiter(self._recent.values(), dtype=np.int64, count=len(self._recent))
        h = id_hashes(list(self._recent))
        order = np.argsort(h, kind="stable")
        h, new = h[order], new[order]
        at = np.searchsorted(self._run_hash, h) + np.arange(len(h))
        mine = np.ones(len(self._run_hash) + len(h), dtype=bool)
        mine[at] = False
        run_h = np.empty(len(mine), dtype=np.uint64)
        run_c = np.empty(len(mine), dtype=np.int64)
        run_h[at], run_h[mine] = h, self._run_hash
        run_c[at], run_c[mine] = new, self._run_handle
        self._run_hash, self._run_handle, self._recent = run_h, run_c, {}

    def handle(self, oid: str, t: int = NO_TIME) -> int:
        """The handle of ``oid``, a new one (with time ``t``, epoch ms) if it has none."""
        h = int(self.lookup([oid])[0])
        if h < 0:
            h = int(self._add([own(oid)], np.array([t], dtype=np.int64))[0])
        return h

    def handles_of(self, oids: Sequence[str], times: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray:
        """:meth:`handle` of distinct ``oids`` (times ``(m,)`` int64 epoch ms; ``keys``: their
        prefix keys ``(m,)`` uint64, if known) in bulk: ``(m,)`` int64, new handles made in one
        extension of the arrays.

        Raises
        ------
        ValueError
            The same id twice among those without a handle.
        """
        out = self.lookup(oids)
        new = np.flatnonzero(out < 0)
        if not len(new):
            return out
        names = [own(oids[j]) for j in new.tolist()]
        if len(set(names)) < len(names):
            raise ValueError("handles_of takes distinct ids")
        first = len(self.oids)
        out[new] = self._add(names, np.asarray(times, dtype=np.int64)[new])
        if keys is not None and self._keyed == first:
            self.key = with_capacity(self.key, len(self.oids))
            self.key[first:len(self.oids)] = keys[new]
            self._keyed = len(self.oids)
        return out

    def handles_in(self, oids: Sequence[str], objects: Mapping[str, ObjectInfo],
                   keys: np.ndarray | None = None) -> np.ndarray:
        """:meth:`handles_of` of distinct ``oids`` whose details ``objects`` may hold: a new
        handle takes its object's time from there (:data:`NO_TIME` if it is not there)."""
        if isinstance(objects, ObjectColumns):
            times = objects.times(oids, NO_TIME)
        else:
            get = objects.get
            times = np.fromiter((NO_TIME if (o := get(oid)) is None else o.t for oid in oids), dtype=np.int64,
                                count=len(oids))
        return self.handles_of(oids, times, keys)

    def key_new(self) -> None:
        """Compute the prefix keys of the handles made since the last call."""
        n = len(self.oids)
        if n > self._keyed:
            self.key = with_capacity(self.key, n)
            self.key[self._keyed:n] = id_prefix_keys(self.oids[self._keyed:n])
            self._keyed = n

    def names(self, handles: Iterable[int]) -> list[str]:
        """The ids of ``handles``."""
        oids = self.oids
        return [oids[h] for h in handles]

    def forget(self, handles: np.ndarray) -> list[str]:
        """Make ``handles``' ids unknown (an expired object's id published again is a new
        object); the handles stay until :meth:`compact`. Returns their ids."""
        gone = self.names(handles.tolist())
        self._known[handles] = False
        for oid in gone:
            self._recent.pop(oid, None)
        return gone

    def compact(self, used: np.ndarray) -> np.ndarray:
        """Keep the sorted handles ``used`` only, renumbered ``0..len(used)-1``; returns the map
        old handle -> new (``(capacity,)`` int64, 0 where dropped)."""
        self.key_new()
        self.oids = self.names(used.tolist())
        remap = np.zeros(len(self.key), dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.key, self.t = self.key[used], self.t[used]
        self._known = self._known[used]
        known = np.flatnonzero(self._known)
        h = id_hashes(self.names(known.tolist()))
        order = np.argsort(h, kind="stable")
        self._run_hash, self._run_handle, self._recent = h[order], known[order], {}
        self._keyed = self.live = len(used)
        return remap
