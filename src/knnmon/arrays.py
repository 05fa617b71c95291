"""Numpy helpers for per-slot tables: capacity doubling as they grow by appends, and the
positions of runs in CSR-style flat arrays."""

from __future__ import annotations

import numpy as np

__all__ = ["members", "run_starts", "runs", "segment_sums", "with_capacity"]


def runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lengths[i] - 1`` of every run, in order: the
    gather indices of rows ``i`` of a CSR-style flat array.

    Parameters
    ----------
    starts, lengths
        ``(n,)`` integers; ``lengths >= 0``.

    Returns
    -------
    numpy.ndarray
        ``(sum(lengths),)`` int64.

    Examples
    --------
    >>> runs(np.array([10, 3]), np.array([2, 3])).tolist()
    [10, 11, 3, 4, 5]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths) + \
        np.arange(int(lengths.sum()), dtype=np.int64)


def members(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Which entries of ``a`` occur in ``b``: ``np.isin(a, b)`` by sorting ``b`` alone and a
    binary search for each of ``a``, O((n + m) log m). numpy's ``isin`` finds the distinct values
    of both first (a hash and a sort in numpy 2.4): ~10x slower for the ~10^5 int64 keys of a
    batch's result diffs.

    Parameters
    ----------
    a
        ``(n,)`` numbers.
    b
        ``(m,)`` numbers of a dtype comparable with ``a``'s, in any order, repeats allowed.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` bool.

    Examples
    --------
    >>> members(np.array([3, 1, 7]), np.array([7, 2, 3, 3])).tolist()
    [True, False, True]
    """
    a = np.asarray(a)
    if not len(b) or not len(a):
        return np.zeros(len(a), dtype=bool)
    s = np.sort(b)
    at = np.searchsorted(s, a)
    at[at == len(s)] = 0
    return s[at] == a


def run_starts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted ``keys``, each element's run of equal keys: ``(start, length)`` of it, in
    O(n) (what ``searchsorted(keys, keys, "left")`` and ``"right"`` give in O(n log n)).

    Parameters
    ----------
    keys
        ``(n,)`` sorted (equal keys adjacent).

    Returns
    -------
    tuple of numpy.ndarray
        ``(n,)`` int64 each: the position of the first element of the run, and the run's length.

    Examples
    --------
    >>> [x.tolist() for x in run_starts(np.array([4, 4, 7, 9, 9, 9]))]
    [[0, 0, 2, 3, 3, 3], [2, 2, 1, 3, 3, 3]]
    """
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    run = np.cumsum(first) - 1
    return starts[run], np.diff(np.append(starts, n))[run]


def segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The sum of each run of ``values`` when it is cut into consecutive runs of ``lengths``
    (a run may be empty: sum 0), the CSR-style counterpart of :func:`runs`.

    Parameters
    ----------
    values
        ``(sum(lengths),)`` numbers or bools.
    lengths
        ``(n,)`` integers ``>= 0``.

    Returns
    -------
    numpy.ndarray
        ``(n,)``, ``values``' accumulating dtype (int64 for bools).

    Examples
    --------
    >>> segment_sums(np.array([True, False, True, True]), np.array([2, 0, 2])).tolist()
    [1, 0, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = np.concatenate([[0], np.cumsum(values)])
    ends = np.cumsum(lengths)
    return total[ends] - total[ends - lengths]


def with_capacity(a: np.ndarray, n: int, growth: float = 2.0) -> np.ndarray:
    """``a`` itself if it has at least ``n`` rows, else ``a`` followed by zero rows up to
    ``max(n, growth * len(a))`` rows (doubling by default, so growing row by row costs amortised
    O(1) a row: ``growth / (growth - 1)`` copies of each row).

    Parameters
    ----------
    a
        ``(m, ...)`` array of any dtype.
    n
        rows needed.
    growth
        ``> 1``: the factor of a growth (a smaller one wastes less spare room and copies more).

    Returns
    -------
    numpy.ndarray
        ``(>= n, ...)``, ``a``'s dtype; its first ``m`` rows are ``a``'s.
    """
    if n <= len(a):
        return a
    return np.concatenate([a, np.zeros((max(n, int(growth * len(a))) - len(a), *a.shape[1:]), dtype=a.dtype)])
