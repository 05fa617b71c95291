"""Binary search of many probes in one large sorted array, cache-friendly."""

from __future__ import annotations

import numpy as np

__all__ = ["equal_range", "searchsorted_batch"]


def searchsorted_batch(keys: np.ndarray, probes: np.ndarray, side: str = "left") -> np.ndarray:
    """``numpy.searchsorted(keys, probes, side)``, with the probes searched in sorted order.

    Over a table far larger than the CPU caches (the routing table's or a worker's grid keys:
    millions of int64), sorted probes make consecutive binary searches share cache lines:
    5,500 random probes into 30 M random keys took 10.4 ms unsorted and 4.4 ms sorted on this
    machine, the sort included (timed ad hoc, three rounds).

    Parameters
    ----------
    keys
        ``(n,)`` sorted array.
    probes
        ``(m,)`` values to look up, in any order.

    Returns
    -------
    ``(m,)`` int64 insertion positions, in the order of ``probes``.
    """
    return _search_sorted_order(keys, probes, (side,))[0]


def equal_range(keys: np.ndarray, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: :func:`searchsorted_batch` with ``side="left"`` and ``"right"``, sorting the
    probes once; ``keys[lo[i]:hi[i]]`` are the entries equal to ``probes[i]``. Shapes as there."""
    lo, hi = _search_sorted_order(keys, probes, ("left", "right"))
    return lo, hi


def _search_sorted_order(keys: np.ndarray, probes: np.ndarray, sides: tuple[str, ...]) -> list[np.ndarray]:
    """One ``searchsorted`` per side over the probes in sorted order (one sort), scattered back."""
    order = np.argsort(probes)
    sorted_probes = probes[order]
    out = []
    for side in sides:
        pos = np.empty(len(probes), dtype=np.int64)
        pos[order] = np.searchsorted(keys, sorted_probes, side=side)
        out.append(pos)
    return out
