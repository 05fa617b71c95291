"""Checkpoints of a service with a window: the objects stream trimmed to what a restart needs.

With a window, a restart needs only the live objects, the queries, the watermark and the stream
positions. The queries are in Redis already (their hashes); the live objects are the entries of
``knn:ingest:objects`` of the batches that still hold a live object. So every
``serve.checkpoint_interval_s`` seconds the service trims the stream below the first entry of the oldest
such batch (``XTRIM MINID``: nothing acknowledged that a live object needs goes, nothing not yet
acknowledged goes) and records the checkpoint in ``knn:serve:checkpoint`` (``watermark``,
``trimmed_below``, ``live_batches``, ``at_ms``). Recovery
(:mod:`~knnmon.coordinator.recovery.rebuild`) then reads the stream from the trim point: its
time follows the window's size, not the stream's history. Each checkpoint also writes the objects
applied since the one before in columns (:mod:`~knnmon.coordinator.recovery.object_snapshot`), so
that a restart parses only the stream's tail; a chunk leaves with the trim of its last entry.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import pyarrow as pa
import redis

from knnmon.connection import with_retries
from knnmon.coordinator.recovery.object_log import OBJECT_SCHEMA
from knnmon.coordinator.recovery.object_snapshot import ChunkWriter, drop_chunks
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS, Limits

__all__ = ["Checkpointer", "next_id"]

log = logging.getLogger("knnmon.serve")


def next_id(entry_id: str) -> str:
    """The smallest stream entry id above ``entry_id`` (``"5-2"`` -> ``"5-3"``)."""
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


class Checkpointer:
    """The acknowledged object batches still holding a live object, and the periodic trim.

    Parameters
    ----------
    client, url, keys
        The service's Redis client, its URL (for retries' messages) and key layout.
    interval_s
        Seconds between checkpoints.
    limits
        The entry limits the objects were parsed with (a chunk records them).
    """

    def __init__(self, client: redis.Redis, url: str, keys: Keys, interval_s: float,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.client, self.url, self.keys, self.interval_s = client, url, keys, interval_s
        self.spans: deque[tuple[str, str, int]] = deque()  # (first, last entry id, largest t applied)
        self.chunks = ChunkWriter(client, url, keys, limits, OBJECT_SCHEMA)
        self._at = time.monotonic()

    def add(self, first: str, last: str, top_t: int | None, objects: pa.Table | None = None) -> None:
        """An acknowledged batch of entries ``first``..``last`` whose applied objects
        (``objects``; ``None``: the ranges a restart read, which its chunks hold or the next
        restart parses) have the largest time ``top_t`` (``None``: nothing applied)."""
        span = (first, last, -(1 << 63) if top_t is None else int(top_t))
        self.spans.append(span)
        if objects is not None:
            self.chunks.add(*span, objects)

    def due(self) -> bool:
        return time.monotonic() - self._at >= self.interval_s

    def checkpoint(self, watermark: int | None, cutoff: int | None) -> int:
        """Trim below the oldest batch with a live object and record the checkpoint; returns the
        entries trimmed.

        Raises
        ------
        StoreUnavailableError
            Redis unreachable after every retry.
        """
        self._at = time.monotonic()
        t0 = time.perf_counter()
        below = None
        while self.spans and cutoff is not None and self.spans[0][2] <= cutoff:
            below = next_id(self.spans.popleft()[1])
        if self.spans and below is not None:
            below = self.spans[0][0]
        n = 0
        self.chunks.write()
        if below is not None:
            n = int(with_retries(lambda: self.client.xtrim(self.keys.ingest_objects, minid=below, approximate=False),
                                 "trimming the objects stream", self.url))
            drop_chunks(self.client, self.url, self.keys, below)
        record = {"watermark": "" if watermark is None else watermark, "live_batches": len(self.spans),
                  "at_ms": int(time.time() * 1000)}
        if below is not None:
            record["trimmed_below"] = below
        with_retries(lambda: self.client.hset(self.keys.serve_checkpoint, mapping=record), "writing the checkpoint",
                     self.url)
        log.info("checkpoint: watermark %s, %d entries trimmed (below %s), %d batches live, in %.3f s", watermark, n,
                 below, len(self.spans), time.perf_counter() - t0)
        return n
