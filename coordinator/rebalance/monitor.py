"""The workers' measured load over recent batches, and when it is uneven enough to re-plan:
over a window of batches (:class:`LoadMonitor`, the default) or smoothed over a few
(:class:`SmoothedMonitor`).

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

__all__ = ["LoadMonitor", "SmoothedMonitor"]


def _ratio(busy: np.ndarray) -> float:
    """Slowest over mean of ``busy`` ``(W,)`` (1.0 when idle)."""
    return float(busy.max() / busy.mean()) if busy.mean() > 0 else 1.0


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
        return _ratio(self.busy())

    def due(self) -> bool:
        """A full window since the last :meth:`reset`, uneven above the threshold."""
        return len(self._busy) == self.window and self.workers > 1 and self.ratio() > self.threshold

    def reset(self, predicted_ms: Sequence[float] | None = None) -> None:
        """Start a new window (after a re-plan; ``predicted_ms`` is not used here)."""
        self._busy.clear()


class SmoothedMonitor:
    """Per-worker busy time smoothed over a few batches, with its noise (``rebalance.trigger
    smoothed``): follows a drift within a few batches instead of waiting for a full window.

    Each worker's busy time per batch ``b_w`` (ms) updates an exponentially weighted mean
    ``m_w`` and variance ``v_w`` (West's incremental form; weight ``a = 1 - 2^(-1/half_life)``
    per batch, so a batch ``half_life`` ago counts half). Re-balancing is due when at least
    ``least`` batches were observed since the last :meth:`reset`, the slowest smoothed worker
    exceeds ``threshold`` times the mean, and its excess over the mean exceeds ``z`` standard
    errors of its smoothed value (``sqrt(v_w * a / (2 - a))``): one noisy batch does not trigger.

    :meth:`reset` after a move takes the move's predicted busy times as the new means, so the
    batches before the move do not make the next one look due.
    """

    def __init__(self, workers: int, half_life: float = 4.0, threshold: float = 1.2, least: int | None = None,
                 z: float = 2.0) -> None:
        self.workers, self.threshold, self.z = workers, threshold, z
        self.alpha = 1.0 - 0.5 ** (1.0 / half_life)
        self.least = max(1, round(half_life)) if least is None else least
        self._m: np.ndarray | None = None
        self._v = np.zeros(workers)
        self.seen = 0

    def observe(self, busy_ms: Sequence[float]) -> None:
        """One batch's busy time per worker, ``(W,)`` ms."""
        b = np.asarray(busy_ms, dtype=np.float64).reshape(self.workers)
        self.seen += 1
        if self._m is None:
            self._m = b.copy()
            return
        d = b - self._m
        self._m += self.alpha * d
        self._v = (1.0 - self.alpha) * (self._v + self.alpha * d * d)

    def busy(self) -> np.ndarray:
        """``(W,)`` float64: each worker's smoothed busy time per batch (ms)."""
        return self._m.copy() if self._m is not None else np.zeros(self.workers)

    def ratio(self) -> float:
        """Slowest over mean smoothed busy time (1.0 when idle)."""
        return _ratio(self.busy())

    def excess_ms(self) -> float:
        """The slowest worker's smoothed busy time over the mean (ms per batch)."""
        b = self.busy()
        return float(b.max() - b.mean())

    def noise(self) -> float:
        """The standard error of the slowest worker's smoothed busy time (ms)."""
        if self._m is None:
            return 0.0
        w = int(np.argmax(self._m))
        return float(np.sqrt(self._v[w] * self.alpha / (2.0 - self.alpha)))

    def due(self) -> bool:
        """Uneven above the threshold and above the noise, ``least`` batches after a reset."""
        if self.seen < self.least or self.workers < 2 or self._m is None:
            return False
        return self.ratio() > self.threshold and self.excess_ms() > self.z * self.noise()

    def reset(self, predicted_ms: Sequence[float] | None = None) -> None:
        """Count anew (after a re-plan); ``predicted_ms`` ``(W,)``: the busy times the move
        predicts, taken as the smoothed means."""
        self.seen = 0
        if predicted_ms is not None and self._m is not None:
            self._m = np.asarray(predicted_ms, dtype=np.float64).reshape(self.workers).copy()
