"""The ids of the objects seen, for the dispatcher's duplicate check, in about 21 bytes per id.

A Python ``set`` of ``str`` costs ~100 bytes per id (the string object and its slot): 2 GB at the
paper's 20 M objects. Here the ids live in sorted **runs**: each run holds the 64-bit hashes of
its ids (:func:`knnmon.encoding.id_hashes`, SipHash) sorted, and the ids themselves in the same
order as one Arrow string array. A lookup is a ``searchsorted`` per run; a hash that matches is confirmed
by comparing the ids (two ids with one hash are both kept, so the check stays exact). New ids
gather in a dict and become a run at :data:`SEAL` ids.

Without a window the runs merge like an LSM tree (the newest into the one before while it is at
least a quarter of its size): O(log n) runs. With one (``windowed``), runs stay in arrival order,
each with its newest time, and a run is forgotten once that time has expired: the memory follows
the window, as the object store's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from knnmon.encoding import id_hashes

__all__ = ["SEAL", "SeenIds"]

#: New ids become a run at this many.
SEAL = 65_536
#: With a window, runs of the initial ids hold this many each (in time order).
WINDOW_RUN = 262_144


#: Ids hashed per chunk of an Arrow array (their Python strings exist one chunk at a time).
CHUNK = 1 << 20


def _hashes(ids: Sequence[str] | pa.Array) -> np.ndarray:
    """``(m,)`` uint64: each id's hash (:func:`knnmon.encoding.id_hashes`), an Arrow array's
    chunk by chunk."""
    if isinstance(ids, pa.Array):
        return np.concatenate([np.empty(0, dtype=np.uint64)] + [_hashes(ids.slice(s, CHUNK).to_pylist())
                                                                 for s in range(0, len(ids), CHUNK)])
    return id_hashes(ids)


@dataclass
class _Run:
    hashes: np.ndarray  # (n,) uint64, sorted
    ids: pa.Array  # (n,) string, in the order of ``hashes``
    t_max: int  # newest time of its ids (epoch ms); only read with a window

    @classmethod
    def of(cls, ids: Sequence[str] | pa.Array, t_max: int, hashes: np.ndarray | None = None) -> _Run:
        h = _hashes(ids) if hashes is None else hashes
        arr = ids if isinstance(ids, pa.Array) else pa.array(list(ids), type=pa.string())
        order = np.argsort(h, kind="stable")
        return cls(h[order], arr.take(pa.array(order)), int(t_max))

    def __len__(self) -> int:
        return len(self.hashes)

    def holds(self, h: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        """``(m,)`` bool: which of the ids (with their hashes ``h``, sorted: lookups in order
        touch the run's memory in order) this run holds."""
        out = np.zeros(len(h), dtype=bool)
        if not len(self.hashes):
            return out
        pos = np.searchsorted(self.hashes, h)
        hit = np.flatnonzero(self.hashes[np.minimum(pos, len(self.hashes) - 1)] == h)
        for j in hit.tolist():  # confirm: the ids of every entry with this hash
            p = int(pos[j])
            while p < len(self.hashes) and self.hashes[p] == h[j]:
                if self.ids[p].as_py() == ids[j]:
                    out[j] = True
                    break
                p += 1
        return out


class SeenIds:
    """Ids seen so far (module docstring).

    Parameters
    ----------
    ids
        The ids seen before the stream (the initial objects: distinct), a sequence or an Arrow
        string array.
    times
        With a window: ``(len(ids),)`` int64 epoch ms, their objects' times.
    windowed
        Forget ids as their objects expire (:meth:`forget`).
    """

    def __init__(self, ids: Sequence[str] | pa.Array = (), times: np.ndarray | None = None, *,
                 windowed: bool = False) -> None:
        self.windowed = windowed
        self._runs: list[_Run] = []
        self._fresh: dict[str, int] = {}  # id -> its object's time, until it becomes a run
        arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        arr = arr if isinstance(arr, pa.Array) else pa.array(list(arr), type=pa.string())
        if not len(arr):
            return
        if windowed:
            t = np.asarray(times, dtype=np.int64)
            order = np.argsort(t, kind="stable")
            for s in range(0, len(order), WINDOW_RUN):
                part = order[s:s + WINDOW_RUN]
                self._runs.append(_Run.of(arr.take(pa.array(part)), int(t[part].max())))
        else:
            self._runs.append(_Run.of(arr, 0))

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs) + len(self._fresh)

    def __contains__(self, oid: object) -> bool:
        return isinstance(oid, str) and bool(self.seen_v([oid])[0])

    def seen_v(self, ids: Sequence[str]) -> np.ndarray:
        """``(m,)`` bool: which of a batch's ids are duplicates -- seen before, or an earlier
        one in the batch has the same id (the first one counts). Changes nothing."""
        m = len(ids)
        dup = np.zeros(m, dtype=bool)
        if not m:
            return dup
        if self._runs:
            h = _hashes(ids)
            order = np.argsort(h)
            h, in_order = h[order], [ids[j] for j in order.tolist()]
            held = np.zeros(m, dtype=bool)
            for r in self._runs:
                held |= r.holds(h, in_order)
            dup[order[held]] = True
        store, first = self._fresh, set()
        for j in np.flatnonzero(~dup).tolist():
            oid = ids[j]
            if oid in store or oid in first:
                dup[j] = True
            else:
                first.add(oid)
        return dup

    def add_new(self, ids: Sequence[str], times: np.ndarray | None = None) -> np.ndarray:
        """Add a batch's ids; returns ``(m,)`` bool, the ones not seen before (an id twice in the
        batch: its first; :meth:`seen_v`). ``times``: with a window, the objects' epoch ms."""
        fresh = ~self.seen_v(ids)
        at = np.flatnonzero(fresh)
        self.add([ids[j] for j in at.tolist()], None if times is None else np.asarray(times)[at])
        return fresh

    def add(self, ids: Sequence[str], times: np.ndarray | None = None) -> None:
        """Add ids known to be new and distinct (admitted already: :meth:`seen_v`). ``times``:
        with a window, the objects' epoch ms."""
        t = np.zeros(len(ids), dtype=np.int64) if times is None else np.asarray(times, dtype=np.int64)
        self._fresh.update(zip(ids, t.tolist()))
        if len(self._fresh) >= SEAL:
            self._seal()

    def _seal(self) -> None:
        """The fresh ids become a run; without a window, merge the newest runs."""
        self._runs.append(_Run.of(list(self._fresh), max(self._fresh.values())))
        self._fresh = {}
        while not self.windowed and len(self._runs) >= 2 and 4 * len(self._runs[-1]) >= len(self._runs[-2]):
            newer, older = self._runs.pop(), self._runs.pop()
            ids = pa.concat_arrays([older.ids, newer.ids])
            self._runs.append(_Run.of(ids, max(older.t_max, newer.t_max),
                                      hashes=np.concatenate([older.hashes, newer.hashes])))

    def forget(self, cutoff: int) -> None:
        """With a window: forget the runs whose objects all have ``t <= cutoff`` (and such
        fresh ids): an id is a duplicate while its run is in the window."""
        self._runs = [r for r in self._runs if r.t_max > cutoff]
        if self._fresh and max(self._fresh.values()) <= cutoff:
            self._fresh = {}
