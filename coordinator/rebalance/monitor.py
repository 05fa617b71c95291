"""The workers' measured load over recent batches, and when it is uneven enough to re-plan.

Each batch's :class:`~knnmon.coordinator.runtime.metrics.BatchReport` carries every worker's busy
time (its thread's CPU time plus the Redis server's time for its writes, ms). The monitor keeps
the last ``window`` of them; re-balancing is due when the slowest worker's mean busy time over
that window exceeds ``threshold`` times the workers' mean (issue 19: 1.2 over N batches), and
at least ``window`` batches passed since the last re-plan (so a re-plan is judged on batches
that ran after it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

__all__ = ["LoadMonitor"]


class LoadMonitor:
    """Sliding window of per-worker busy times (module docstring).

    Parameters
    ----------
    workers
        ``W``.
    window
        Batches in the window (``N``), ``>= 1``.
    threshold
        Slowest / mean busy time above which re-balancing is due, ``>= 1``.
    """

    def __init__(self, workers: int, window: int = 20, threshold: float = 1.2) -> None:
        self.workers, self.window, self.threshold = workers, window, threshold
        self._busy: deque[np.ndarray] = deque(maxlen=window)

    def observe(self, busy_ms: Sequence[float]) -> None:
        """One batch's busy time per worker, ``(W,)`` ms."""
        self._busy.append(np.asarray(busy_ms, dtype=np.float64).reshape(self.workers))

    def busy(self) -> np.ndarray:
        """``(W,)`` float64: each worker's mean busy time per batch over the window (ms)."""
        return np.mean(self._busy, axis=0) if self._busy else np.zeros(self.workers)

    def ratio(self) -> float:
        """Slowest over mean busy time over the window (1.0 when idle)."""
        b = self.busy()
        return float(b.max() / b.mean()) if b.mean() > 0 else 1.0

    def due(self) -> bool:
        """A full window since the last :meth:`reset`, uneven above the threshold."""
        return len(self._busy) == self.window and self.workers > 1 and self.ratio() > self.threshold

    def reset(self) -> None:
        """Start a new window (after a re-plan)."""
        self._busy.clear()
