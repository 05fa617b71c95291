"""The objects a worker's lists hold, by handle: an int per object id that entered a result here.

The top-k lists (:mod:`knnmon.workers.topk_lists`) store handles, not ids; a handle indexes
``oids`` (the id), ``key`` (its 8-byte order-preserving prefix key,
:func:`knnmon.encoding.id_prefix_keys`, for ties by id in the kernels) and ``t`` (its time, for
a window's expiry). Handles of objects no list holds are released by :meth:`ObjectHandles.compact`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.batch import ObjectInfo
from knnmon.encoding import id_prefix_keys
from knnmon.workers.vocabulary import own

__all__ = ["NO_TIME", "ObjectHandles"]

#: The time of an object whose time a worker was not told (it never expires).
NO_TIME = np.iinfo(np.int64).max


class ObjectHandles:
    """Object id <-> handle, with each handle's prefix key and time (module docstring).

    ``key`` and ``t`` are capacity-doubled ``(>= len(self),)`` uint64 and int64 arrays; ``live``
    is the number of handles after the last :meth:`compact` (the worker compacts when the
    handles outgrow it).
    """

    def __init__(self) -> None:
        self.oids: list[str] = []
        self.handle_of: dict[str, int] = {}
        self.key = np.zeros(0, dtype=np.uint64)
        self.t = np.zeros(0, dtype=np.int64)
        self._keyed = 0
        self.live = 0

    def __len__(self) -> int:
        return len(self.oids)

    def handle(self, oid: str, t: int = NO_TIME) -> int:
        """The handle of ``oid``, a new one (with time ``t``, epoch ms) if it has none."""
        h = self.handle_of.get(oid)
        if h is None:
            oid = own(oid)
            h = self.handle_of[oid] = len(self.oids)
            self.oids.append(oid)
            self.t = with_capacity(self.t, h + 1)
            self.t[h] = t
        return h

    def handles_of(self, oids: Sequence[str], times: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray:
        """:meth:`handle` of distinct ``oids`` (times ``(m,)`` int64 epoch ms; ``keys``: their
        prefix keys ``(m,)`` uint64, if known) in bulk: ``(m,)`` int64, new handles made in one
        extension of the arrays."""
        get = self.handle_of.get
        out = np.fromiter((get(o, -1) for o in oids), dtype=np.int64, count=len(oids))
        new = np.flatnonzero(out < 0)
        if not len(new):
            return out
        names = [own(oids[j]) for j in new.tolist()]
        if len(set(names)) < len(names):
            raise ValueError("handles_of takes distinct ids")
        first = len(self.oids)
        self.oids.extend(names)
        self.handle_of.update(zip(names, range(first, first + len(names))))
        self.t = with_capacity(self.t, len(self.oids))
        self.t[first:len(self.oids)] = np.asarray(times, dtype=np.int64)[new]
        out[new] = np.arange(first, len(self.oids))
        if keys is not None and self._keyed == first:
            self.key = with_capacity(self.key, len(self.oids))
            self.key[first:len(self.oids)] = keys[new]
            self._keyed = len(self.oids)
        return out

    def handle_in(self, oid: str, objects: Mapping[str, ObjectInfo]) -> int:
        """:meth:`handle` of an object whose details ``objects`` may hold (its time, if so)."""
        info = objects.get(oid)
        return self.handle(oid, info.t if info is not None else NO_TIME)

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
        for oid in gone:
            self.handle_of.pop(oid, None)
        return gone

    def compact(self, used: np.ndarray) -> np.ndarray:
        """Keep the sorted handles ``used`` only, renumbered ``0..len(used)-1``; returns the map
        old handle -> new (``(capacity,)`` int64, 0 where dropped)."""
        self.key_new()
        self.oids = self.names(used.tolist())
        self.handle_of = {oid: h for h, oid in enumerate(self.oids)}
        remap = np.zeros(len(self.key), dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.key, self.t = self.key[used], self.t[used]
        self._keyed = self.live = len(used)
        return remap
