"""The objects a worker's lists hold, by handle: an int per object id that entered a result here.

The top-k lists (:mod:`knnmon.workers.topk_lists`) store handles, not ids; a handle is a row of
``ids`` (an :class:`~knnmon.id_table.IdTable`: the ids' bytes in one buffer, each found by its
hash in a sorted run, no Python object per held object) and indexes ``key`` (its 8-byte
order-preserving prefix key, :func:`knnmon.encoding.id_prefix_keys`, for ties by id in the
kernels) and ``t`` (its time, for a window's expiry). Handles of objects no list holds are
released by :meth:`ObjectHandles.compact`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.batch import ObjectColumns, ObjectInfo
from knnmon.encoding import id_prefix_keys
from knnmon.id_table import IdTable

__all__ = ["NO_TIME", "ObjectHandles"]

#: The time of an object whose time a worker was not told (it never expires).
NO_TIME = np.iinfo(np.int64).max


class ObjectHandles:
    """Object id <-> handle, with each handle's prefix key and time (module docstring).

    ``ids`` is the :class:`~knnmon.id_table.IdTable` of the handles' ids; ``key`` and ``t`` are
    capacity-doubled ``(>= len(self),)`` uint64 and int64 arrays; ``live`` is the number of
    handles after the last :meth:`compact` (the worker compacts when the handles outgrow it).
    """

    def __init__(self) -> None:
        self.ids = IdTable()
        self.key = np.zeros(0, dtype=np.uint64)
        self.t = np.zeros(0, dtype=np.int64)
        self._keyed = 0
        self.live = 0

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, oids: Sequence[str]) -> np.ndarray:
        """``(m,)`` int64: each id's handle, ``-1`` for an id with none (never seen, or
        forgotten)."""
        return self.ids.lookup(oids)

    def __contains__(self, oid: object) -> bool:
        return oid in self.ids

    def _add(self, names: list[str], times: np.ndarray) -> np.ndarray:
        """New handles for distinct ``names`` not held (times epoch ms): ``(m,)`` int64."""
        rows = self.ids.add(names)
        self.t = with_capacity(self.t, rows.stop)
        self.t[rows.start:rows.stop] = times
        return np.arange(rows.start, rows.stop, dtype=np.int64)

    def handle(self, oid: str, t: int = NO_TIME) -> int:
        """The handle of ``oid``, a new one (with time ``t``, epoch ms) if it has none."""
        h = int(self.lookup([oid])[0])
        if h < 0:
            h = int(self._add([oid], np.array([t], dtype=np.int64))[0])
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
        names = [oids[j] for j in new.tolist()]
        if len(set(names)) < len(names):
            raise ValueError("handles_of takes distinct ids")
        first = len(self.ids)
        out[new] = self._add(names, np.asarray(times, dtype=np.int64)[new])
        if keys is not None and self._keyed == first:
            self.key = with_capacity(self.key, len(self.ids))
            self.key[first:len(self.ids)] = keys[new]
            self._keyed = len(self.ids)
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
        n = len(self.ids)
        if n > self._keyed:
            self.key = with_capacity(self.key, n)
            self.key[self._keyed:n] = id_prefix_keys(self.ids.names(np.arange(self._keyed, n)))
            self._keyed = n

    def names(self, handles: Iterable[int] | np.ndarray) -> list[str]:
        """The ids of ``handles``."""
        return self.ids.names(handles)

    def forget(self, handles: np.ndarray) -> list[str]:
        """Make ``handles``' ids unknown (an expired object's id published again is a new
        object); the handles stay until :meth:`compact`. Returns their ids."""
        return self.ids.forget(handles)

    def compact(self, used: np.ndarray) -> np.ndarray:
        """Keep the sorted handles ``used`` only, renumbered ``0..len(used)-1``; returns the map
        old handle -> new (``(capacity,)`` int64, 0 where dropped)."""
        self.key_new()
        self.ids.keep(used)
        remap = np.zeros(len(self.key), dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.key, self.t = self.key[used], self.t[used]
        self._keyed = self.live = len(used)
        return remap
