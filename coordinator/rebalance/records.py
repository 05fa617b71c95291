"""Re-plan records: numbered, kept in Redis (``knn:replans``, newest first, the last
:data:`~knnmon.keys.REPLANS_KEPT`), and judged :data:`REALIZED_AFTER` batches after a move by
the **realised gain**: how much the slowest worker's busy time per batch fell, against the
``predicted_gain`` the plan promised (issue 36's calibration of predicted against realised)."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from knnmon.connection import connect, with_retries
from knnmon.coordinator.runtime.rebalance_config import Replan
from knnmon.keys import REPLANS_KEPT, Keys

__all__ = ["REALIZED_AFTER", "ReplanRecords"]

#: Batches after a re-plan over which its realised gain is measured.
REALIZED_AFTER = 10


class ReplanRecords:
    """The re-plans of a run (module docstring).

    Parameters
    ----------
    redis_url, namespace
        Where the records go (``None``: kept in memory only).
    """

    def __init__(self, redis_url: str | None, namespace: str = "knn") -> None:
        self.redis_url, self.keys = redis_url, Keys(namespace)
        self.numbered = self._last_number()  # a resumed service's re-plans continue the count
        self._judged: tuple[Replan, list[np.ndarray]] | None = None  # a move's realised gain, pending

    def next_number(self) -> int:
        """The number of the next re-plan (1, 2, ... continuing a resumed service's)."""
        self.numbered += 1
        return self.numbered

    def add(self, record: Replan, moved: bool) -> None:
        """A new re-plan's record: the one before is judged over the batches since it, this
        one (``moved``: it moved queries) from now on; pushed onto ``knn:replans``."""
        self._judge()
        self._judged = (record, []) if moved else None
        self.store(record)

    def observe(self, busy_ms) -> None:
        """Add a batch's busy times ``(W,)`` ms to the last move's; after :data:`REALIZED_AFTER`
        of them (or fewer, at the next re-plan), judge it."""
        if self._judged is None:
            return
        self._judged[1].append(np.asarray(busy_ms, dtype=np.float64))
        if len(self._judged[1]) >= REALIZED_AFTER:
            self._judge()

    def _judge(self) -> None:
        """Record the pending move's ``realized_gain``: the fall of the slowest worker's mean
        busy time per batch over the batches since, from the measured busy times the plan started
        from, as a share of them (the ``predicted_gain``'s terms); ``realized_after_batches``:
        how many."""
        if self._judged is None or not self._judged[1]:
            return
        record, after = self._judged
        self._judged = None
        top = max(record.measured_busy_ms)
        record.realized_gain = round((top - float(np.mean(after, axis=0).max())) / top, 4) if top > 0 else 0.0
        record.realized_after_batches = len(after)
        self.store(record, update=True)

    def _last_number(self) -> int:
        """The number of the newest re-plan recorded in Redis (0: none, or unreadable)."""
        if self.redis_url is None:
            return 0
        client = connect(self.redis_url)
        try:
            head = with_retries(lambda: client.lindex(self.keys.replans, 0), "reading the re-plans", self.redis_url)
            number = json.loads(head).get("replan", 0) if head else 0
            return number if isinstance(number, int) and number >= 0 else 0
        except (ValueError, AttributeError):
            return 0
        finally:
            client.close()

    def store(self, record: Replan, update: bool = False) -> None:
        """Push ``record`` onto ``knn:replans``; ``update``: replace it there instead, if it is
        still the newest."""
        if self.redis_url is None:
            return
        client = connect(self.redis_url)
        try:
            def write():
                if update:
                    head = client.lindex(self.keys.replans, 0)
                    if head and json.loads(head).get("replan") == record.replan:
                        client.lset(self.keys.replans, 0, json.dumps(asdict(record)))
                    return
                client.lpush(self.keys.replans, json.dumps(asdict(record)))
                client.ltrim(self.keys.replans, 0, REPLANS_KEPT - 1)
            with_retries(write, "recording a re-plan", self.redis_url)
        finally:
            client.close()
