"""Growable numpy arrays: capacity doubling for per-slot tables that grow by appends."""

from __future__ import annotations

import numpy as np

__all__ = ["with_capacity"]


def with_capacity(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` itself if it has at least ``n`` rows, else ``a`` followed by zero rows up to
    ``max(n, 2 * len(a))`` rows (doubling, so growing row by row costs amortised O(1) a row).

    Parameters
    ----------
    a
        ``(m, ...)`` array of any dtype.
    n
        rows needed.

    Returns
    -------
    numpy.ndarray
        ``(>= n, ...)``, ``a``'s dtype; its first ``m`` rows are ``a``'s.
    """
    if n <= len(a):
        return a
    return np.concatenate([a, np.zeros((max(n, 2 * len(a)) - len(a), *a.shape[1:]), dtype=a.dtype)])
