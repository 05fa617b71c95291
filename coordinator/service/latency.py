"""Per-object response times of ``knnmon serve`` as a bounded histogram in each batch record.

A (mini)batch's objects need not be consecutive entries of the objects stream (Short-Job-First
minibatches, :mod:`~knnmon.coordinator.service.batching`), so each record of
``knn:serve:batches`` carries its objects' response times (publish, i.e. the entry id's time,
to acknowledgement, ms) as ``lat_hist``: ``"bucket:count ..."`` over logarithmic buckets of 5 %
(bucket ``i`` holds ``[BASE_MS * FACTOR**i, BASE_MS * FACTOR**(i + 1))``; times below ``BASE_MS``
in bucket 0). Bounded: at most :data:`BUCKETS` pairs whatever the batch size. Summing the
histograms of a run's records gives its percentiles to within 5 %.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["BASE_MS", "BUCKETS", "FACTOR", "decode", "encode", "mean", "midpoints", "percentile"]

BASE_MS = 0.1
FACTOR = 1.05
#: Buckets up to about 10 hours.
BUCKETS = int(math.ceil(math.log(3.6e7 / BASE_MS) / math.log(FACTOR)))


def encode(ms: np.ndarray) -> str:
    """``"bucket:count ..."`` of response times ``ms`` (``(n,)`` float64 milliseconds)."""
    ms = np.asarray(ms, dtype=np.float64)
    ms = ms[np.isfinite(ms)]
    with np.errstate(divide="ignore"):
        b = np.floor(np.log(np.maximum(ms, BASE_MS) / BASE_MS) / math.log(FACTOR))
    b = np.clip(b, 0, BUCKETS - 1).astype(np.int64)
    u, c = np.unique(b, return_counts=True)
    return " ".join(f"{i}:{n}" for i, n in zip(u.tolist(), c.tolist()))


def decode(texts: Iterable[str]) -> np.ndarray:
    """The summed histogram ``(BUCKETS,)`` int64 of encoded histograms; malformed parts are skipped."""
    out = np.zeros(BUCKETS, dtype=np.int64)
    for text in texts:
        for part in (text or "").split():
            i, _, n = part.partition(":")
            if i.isdigit() and n.isdigit() and int(i) < BUCKETS:
                out[int(i)] += int(n)
    return out


def percentile(hist: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100) of a histogram, ms: the geometric middle of its bucket
    (``nan`` for an empty histogram)."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    i = int(np.searchsorted(np.cumsum(hist), max(1, math.ceil(q / 100 * total))))
    return float(midpoints()[i])


def midpoints() -> np.ndarray:
    """``(BUCKETS,)`` float64: each bucket's geometric middle, ms."""
    return BASE_MS * FACTOR ** (np.arange(BUCKETS) + 0.5)


def mean(hist: np.ndarray) -> float:
    """The mean of a histogram (bucket middles), ms."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    return float((hist * midpoints()).sum() / total)
