"""Sorted runs of the query index's grid entries, and their compiled merge.

A run (:class:`GridRun`) holds grid entries sorted by key: ``keys`` (int64), ``slots`` (int64,
the query slot) and ``gens`` (int32, the generation of the slot's entries each one belongs to).
The query index (:class:`~knnmon.workers.query_index.QueryIndex`) keeps a large base, a middle
run and a small delta, and merges them as they fill (a log-structured merge).

- :func:`merge_current` merges two runs in one compiled pass, drops the superseded entries
  (those whose generation is no longer their slot's) and takes them off the index's per
  (keyword code, level) counts in the same pass.
- :class:`PartedBase` holds the base cut by key into parts, so that the middle run is folded
  into it one part per batch: a merge of the whole base in one batch made its worker that
  batch's slowest by far (measured at 1 M queries).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from knnmon.jit import jit as _jit

__all__ = ["GridRun", "PartedBase", "compile_kernels", "merge_current"]


@_jit
def _merge(ka: np.ndarray, sa: np.ndarray, ga: np.ndarray, kb: np.ndarray, sb: np.ndarray, gb: np.ndarray,
           gen: np.ndarray, levels: np.ndarray, cell_bits: int, code_bits: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The kernel of :func:`merge_current` (same arguments, unpacked): the merged keys, slots
    and generations (views of arrays of ``len(a) + len(b)`` entries), then the distinct keys and
    their starts (:attr:`GridRun.distinct`). An entry of ``a`` goes before an entry of ``b``
    with the same key."""
    na, nb = len(ka), len(kb)
    ko = np.empty(na + nb, dtype=np.int64)
    so = np.empty(na + nb, dtype=np.int64)
    go = np.empty(na + nb, dtype=np.int32)
    first = np.empty(na + nb + 1, dtype=np.int64)
    code_mask = (1 << code_bits) - 1
    i = j = m = u = 0
    while i < na or j < nb:
        if j >= nb or (i < na and ka[i] <= kb[j]):
            k, s, g = ka[i], sa[i], ga[i]
            i += 1
        else:
            k, s, g = kb[j], sb[j], gb[j]
            j += 1
        if g != gen[s]:
            levels[(k >> cell_bits) & code_mask, k >> (cell_bits + code_bits)] -= 1
            continue
        if m == 0 or k != ko[m - 1]:
            first[u] = m
            u += 1
        ko[m], so[m], go[m] = k, s, g
        m += 1
    first[u] = m
    ukeys = np.empty(u, dtype=np.int64)
    for x in range(u):
        ukeys[x] = ko[first[x]]
    return ko[:m], so[:m], go[:m], ukeys, first[:u + 1]


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`GridRun.distinct` of sorted ``keys``."""
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys
    return keys[first], np.r_[first, len(keys)]


@dataclass
class GridRun:
    """Grid entries sorted by key (module docstring): ``keys`` ``(e,)`` int64, ``slots`` ``(e,)``
    int64, ``gens`` ``(e,)`` int32."""

    keys: np.ndarray
    slots: np.ndarray
    gens: np.ndarray

    @classmethod
    def empty(cls) -> GridRun:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32))

    def __len__(self) -> int:
        return len(self.keys)

    @cached_property
    def distinct(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct keys ``(u,)`` and where each one's entries start ``(u + 1,)`` (int64);
        computed on the first probe, so runs merged away unprobed (a refresh's new entries, a
        merge's inputs) never pay for it. A probe is one binary search among the distinct keys,
        not two among all entries (:func:`~knnmon.workers.kernels.grid_hits`). A merged run
        (:func:`merge_current`) comes with it."""
        return _distinct(self.keys)


def merge_current(a: GridRun, b: GridRun, gen: np.ndarray, levels: np.ndarray, cell_bits: int,
                  code_bits: int) -> GridRun:
    """``a`` and ``b`` merged in key order without their superseded entries: O(entries), no sort.

    Parameters
    ----------
    a, b
        Runs sorted by key; their slots must be below ``len(gen)``.
    gen
        ``(Q,)`` int32: each slot's current generation; an entry with another one is dropped.
    levels
        ``(codes, levels)`` int32 entry counts per (keyword code, level), updated in place: each
        dropped entry's count is taken off. Its keys' codes and levels must be within it.
    cell_bits, code_bits
        The key layout: ``level << (code_bits + cell_bits) | code << cell_bits | cell``.

    Returns
    -------
    GridRun
        The merged run, a new one (``a``'s entries first among equal keys).
    """
    n = len(a) + len(b)
    keys, slots, gens, ukeys, ustart = _merge(a.keys, a.slots, a.gens, b.keys, b.slots, b.gens, gen, levels,
                                              cell_bits, code_bits)
    # a view of under 3/4 of its buffer is copied (the rest would stay held as long as the run)
    keys, slots, gens, ukeys, ustart = (x.copy() if 4 * len(x) < 3 * n else x
                                        for x in (keys, slots, gens, ukeys, ustart))
    run = GridRun(keys, slots, gens)
    run.__dict__["distinct"] = (ukeys, ustart)  # the cached property, computed in the same pass
    return run


def compile_kernels() -> None:
    """Compile (or load from the cache) the kernels for the dtypes the query index passes."""
    e = GridRun.empty()
    merge_current(e, e, np.zeros(0, np.int32), np.zeros((0, 1), np.int32), 0, 0)


class PartedBase:
    """The index's base run, cut by key into parts of about ``part_entries`` entries, so that
    folding the middle run into it is one step per part (:meth:`fold`), each of them as cheap as
    a part, rather than one merge as long as the whole base. Part ``i`` holds the keys in
    ``[lows[i], lows[i + 1])``; equal keys are never split between parts (module docstring).
    """

    def __init__(self, run: GridRun, part_entries: int) -> None:
        self.part_entries = max(int(part_entries), 1)
        self.parts: list[GridRun] = []
        self.lows: list[int] = []
        for low, part in self._cut(run, np.iinfo(np.int64).min):
            self.parts.append(part)
            self.lows.append(low)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def _cut(self, run: GridRun, low: int) -> list[tuple[int, GridRun]]:
        """``run`` (whose keys are ``>= low``) cut into ``(lowest key covered, part)`` pieces of
        about ``part_entries`` entries, at key changes (views, no copies)."""
        n, size = len(run), self.part_entries
        at = [0] + sorted({int(np.searchsorted(run.keys, run.keys[p], "left")) for p in range(size, n, size)} - {0})
        out = []
        for i, a in enumerate(at):
            b = at[i + 1] if i + 1 < len(at) else n
            out.append((low if i == 0 else int(run.keys[a]),
                        GridRun(run.keys[a:b], run.slots[a:b], run.gens[a:b])))
        return out

    def high(self, i: int) -> int:
        """The first key above part ``i``'s range (``2**63 - 1`` for the last part)."""
        return self.lows[i + 1] if i + 1 < len(self.parts) else np.iinfo(np.int64).max

    def fold(self, i: int, entries: GridRun, merge) -> int:
        """Replace part ``i`` with ``merge(part, entries)`` (``entries``: keys within its
        range), cut again if it grew past twice ``part_entries``. Returns the number of parts
        it now is."""
        merged = merge(self.parts[i], entries)
        pieces = self._cut(merged, self.lows[i]) if len(merged) > 2 * self.part_entries else [(self.lows[i], merged)]
        self.parts[i:i + 1] = [p for _, p in pieces]
        self.lows[i:i + 1] = [low for low, _ in pieces]
        return len(pieces)
