"""Ids and other strings in columns: one byte buffer and an offset per string, found by hash runs.

A worker holds an id per registered query and per object a result holds, at millions of each. A
``list`` of ``str`` costs ~57 bytes per string beyond its characters (the object header and the
list's pointer) and a ``dict`` to find them ~40-100 more. :class:`StringColumn` keeps the
strings' UTF-8 bytes in one growing ``uint8`` buffer with an int64 end offset each (8 bytes per
string beyond its characters), as an Arrow large-string array does, and hands them out as Arrow
arrays without copying. :class:`IdTable` adds the lookup: an id is found by its 64-bit hash
(:func:`knnmon.encoding.id_hashes`) in a sorted **run** of the ids' hashes, a hit confirmed by
comparing the ids (two ids with one hash both stay findable); the ids added since the run was
last sealed are in a small ``dict``. 17 bytes per id for the lookup (a hash, a row, a flag).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from knnmon.arrays import with_capacity
from knnmon.encoding import id_hashes, string_buffers

__all__ = ["IdTable", "SEAL", "StringColumn"]

#: The ids added since the last seal (in a dict) join the sorted run at this many.
SEAL = 1 << 14

#: A column's buffers grow by this factor (not doubling: up to half of the largest buffer a
#: worker holds would be spare room; each byte is copied ~5 times as it grows, not ~2).
GROWTH = 1.25

#: :meth:`StringColumn.names` of fewer rows than this decodes them one by one (an Arrow call's
#: fixed cost is ~10 us).
_FEW = 16


class StringColumn:
    """Strings by row: UTF-8 bytes in one buffer, row ``i`` at ``data[end[i-1]:end[i]]``.

    Rows are only appended, or kept by :meth:`keep` (renumbered). Each string costs its UTF-8
    bytes and 8 bytes of offset, and spare room of up to :data:`GROWTH` times that.
    """

    def __init__(self, strings: Sequence[str] = ()) -> None:
        self._data = np.zeros(0, dtype=np.uint8)
        self._off = np.zeros(1, dtype=np.int64)  # (n + 1,) used: row i is data[off[i]:off[i + 1]]
        self._n = 0
        if len(strings):
            self.append(strings)

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes allocated (buffer and offsets, with their spare capacity)."""
        return self._data.nbytes + self._off.nbytes

    def append(self, strings: Sequence[str] | pa.Array) -> range:
        """Add ``strings`` (``str`` each, or an Arrow string array without nulls); returns
        their rows.

        Raises
        ------
        TypeError
            An element is not a string (Arrow's conversion error).
        """
        arr = strings if isinstance(strings, pa.Array) else pa.array(list(strings), type=pa.large_string())
        if arr.type != pa.large_string():
            arr = arr.cast(pa.large_string())
        m, first = len(arr), self._n
        if not m:
            return range(first, first)
        off, data = string_buffers(arr)
        size = int(off[-1] - off[0])
        at = int(self._off[first])
        self._data = with_capacity(self._data, at + size, GROWTH)
        if size:
            self._data[at:at + size] = data[int(off[0]):int(off[-1])]
        self._off = with_capacity(self._off, first + m + 1, GROWTH)
        self._off[first + 1:first + m + 1] = off[1:] - off[0] + at
        self._n = first + m
        return range(first, first + m)

    def __getitem__(self, row: int) -> str:
        row = int(row)
        if not 0 <= row < self._n:
            raise IndexError(f"row {row} of {self._n}")
        return self._data[self._off[row]:self._off[row + 1]].tobytes().decode()

    def arrow(self) -> pa.LargeStringArray:
        """Every row as an Arrow large-string array over this column's buffers (no copy; valid
        until the next :meth:`append` or :meth:`keep`)."""
        n = self._n
        return pa.LargeStringArray.from_buffers(n, pa.py_buffer(self._off[:n + 1]),
                                                pa.py_buffer(self._data[:int(self._off[n])]))

    def names(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        """The strings of ``rows`` (ints, or an int array), in that order."""
        rows = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        if len(rows) < _FEW:
            return [self[r] for r in rows.tolist()]
        self._check_rows(rows)
        return self.arrow().take(pa.array(rows)).to_pylist()

    def tolist(self) -> list[str]:
        """Every row's string."""
        return self.arrow().to_pylist()

    def keep(self, rows: np.ndarray) -> None:
        """Keep ``rows`` only (``(m,)`` int64, any order), renumbered ``0..m-1``: Arrow's
        ``take`` copies each kept string once (no gather index per byte).

        Raises
        ------
        IndexError
            A row outside ``0..len(self)-1``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        self._check_rows(rows)
        taken = self.arrow().take(pa.array(rows))  # (new buffers: the old ones may go)
        self._data, self._off, self._n = np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64), 0
        self.append(taken)  # (into empty arrays: exactly their size)

    def _check_rows(self, rows: np.ndarray) -> None:
        """Raise ``IndexError`` if a row of ``rows`` (int64) is outside ``0..len(self)-1``."""
        if len(rows) and (rows.min() < 0 or rows.max() >= self._n):
            raise IndexError(f"a row outside 0..{self._n - 1}")


class IdTable(StringColumn):
    """Distinct ids by row, each found by :meth:`lookup` until it is forgotten (module
    docstring). Rows are never reused: a forgotten id keeps its row (and string) until
    :meth:`keep` drops it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._known = np.zeros(0, dtype=bool)  # per row: findable by its id (not forgotten)
        self._run_hash = np.zeros(0, dtype=np.uint64)  # the sealed rows' hashes, sorted
        self._run_row = np.zeros(0, dtype=np.int64)  # ... and their rows, in that order
        self._recent: dict[str, int] = {}  # the rows added since the last seal

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._known.nbytes + self._run_hash.nbytes + self._run_row.nbytes

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """``(m,)`` int64: each id's row, ``-1`` for an id not held (never added, or
        forgotten)."""
        m = len(ids)
        out = np.full(m, -1, dtype=np.int64)
        if not m:
            return out
        recent = self._recent
        if recent:
            out[:] = np.fromiter((recent.get(o, -1) for o in ids), dtype=np.int64, count=m)
        n = len(self._run_hash)
        rest = np.flatnonzero(out < 0)
        if not n or not len(rest):
            return out
        asked = [ids[j] for j in rest.tolist()]
        h = id_hashes(asked)
        pos = np.minimum(np.searchsorted(self._run_hash, h), n - 1)
        hit = np.flatnonzero(self._run_hash[pos] == h)
        first = self._run_row[pos[hit]]
        ok = self._known[first] & np.fromiter((a == b for a, b in zip(self.names(first), (asked[i] for i in hit.tolist()))),
                                              dtype=bool, count=len(hit))
        out[rest[hit[ok]]] = first[ok]
        for i in hit[~ok].tolist():  # a forgotten id's or another id's row first: the others with this hash
            p, oid = int(pos[i]) + 1, asked[i]
            while p < n and self._run_hash[p] == h[i]:
                c = int(self._run_row[p])
                if self._known[c] and self[c] == oid:
                    out[rest[i]] = c
                    break
                p += 1
        return out

    def get(self, oid: str, default: int | None = None) -> int | None:
        """The row of ``oid``, or ``default``."""
        r = int(self.lookup([oid])[0]) if isinstance(oid, str) else -1
        return default if r < 0 else r

    def __contains__(self, oid: object) -> bool:
        return isinstance(oid, str) and bool(self.lookup([oid])[0] >= 0)

    def add(self, ids: Sequence[str]) -> range:
        """Append distinct ids this table does not hold (not checked here: :meth:`lookup`
        first); returns their rows."""
        rows = self.append(ids)
        self._known = with_capacity(self._known, len(self), GROWTH)
        self._known[rows.start:rows.stop] = True
        self._recent.update(zip(ids, rows))
        if len(self._recent) >= SEAL:
            self._seal()
        return rows

    def _seal(self) -> None:
        """The recent rows join the sorted run (by merging, O(run))."""
        new = np.fromiter(self._recent.values(), dtype=np.int64, count=len(self._recent))
        h = id_hashes(list(self._recent))
        order = np.argsort(h, kind="stable")
        h, new = h[order], new[order]
        at = np.searchsorted(self._run_hash, h) + np.arange(len(h))
        mine = np.ones(len(self._run_hash) + len(h), dtype=bool)
        mine[at] = False
        run_h = np.empty(len(mine), dtype=np.uint64)
        run_r = np.empty(len(mine), dtype=np.int64)
        run_h[at], run_h[mine] = h, self._run_hash
        run_r[at], run_r[mine] = new, self._run_row
        self._run_hash, self._run_row, self._recent = run_h, run_r, {}

    def forget(self, rows: np.ndarray) -> list[str]:
        """Make the ids of ``rows`` unfindable (their rows stay until :meth:`keep`); returns
        them."""
        rows = np.asarray(rows, dtype=np.int64)
        gone = self.names(rows)
        self._known[rows] = False
        for oid in gone:
            self._recent.pop(oid, None)
        return gone

    def known(self, rows: np.ndarray) -> np.ndarray:
        """``(m,)`` bool: whether the ids of ``rows`` are findable."""
        return self._known[np.asarray(rows, dtype=np.int64)]

    def keep(self, rows: np.ndarray) -> None:
        """Keep ``rows`` only (sorted), renumbered ``0..m-1``; a forgotten one stays forgotten."""
        rows = np.asarray(rows, dtype=np.int64)
        super().keep(rows)
        self._known = self._known[rows]
        known = np.flatnonzero(self._known)
        h = id_hashes(self.names(known))
        order = np.argsort(h, kind="stable")
        self._run_hash, self._run_row, self._recent = h[order], known[order], {}
