"""Binary search of many probes in one large sorted array, cache-friendly."""

from __future__ import annotations

import numpy as np

__all__ = ["searchsorted_batch"]


def searchsorted_batch(keys: np.ndarray, probes: np.ndarray, side: str = "left") -> np.ndarray:
    """``numpy.searchsorted(keys, probes, side)``, with the probes searched in sorted order.

    Over a table far larger than the CPU caches (the routing table's or a worker's grid keys:
    millions of int64), sorted probes make consecutive binary searches share cache lines
    (docs/runtime.md has the timing).

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
    order = np.argsort(probes)
    pos = np.empty(len(probes), dtype=np.int64)
    pos[order] = np.searchsorted(keys, probes[order], side=side)
    return pos
