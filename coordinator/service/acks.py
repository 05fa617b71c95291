"""Acknowledging ingest entries exactly once, with their rejects (the stream protocol's last step)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from knnmon.connection import with_retries
from knnmon.protocol import GROUP
from knnmon.errors import Rejected
from knnmon.keys import Keys

__all__ = ["BATCHES_MAXLEN", "REJECTS_MAXLEN", "acknowledge"]

#: Approximate caps of the service's own streams (XADD MAXLEN ~).
REJECTS_MAXLEN = 1_000_000
BATCHES_MAXLEN = 100_000


def acknowledge(client: redis.Redis, url: str, keys: Keys, stream: str, ids: Sequence[str],
                rejects: Sequence[tuple[str, dict, Rejected]], batch_record: dict[str, Any] | None = None, *,
                delete: Sequence[str] = ()) -> None:
    """Write ``rejects`` to ``ingest:rejects`` (original fields plus ``_reason``, ``_detail``,
    ``_stream``, ``_entry``), acknowledge entries ``ids`` of ``stream``, delete its entries
    ``delete`` (rejected ones whose fields the rejects keep) and log ``batch_record`` to
    ``serve:batches``, in one MULTI (in a Redis Cluster: in that order, without MULTI). A retry
    first checks whether the entries are still pending, so nothing is written twice.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    if not ids:
        return

    cluster = isinstance(client, RedisCluster)

    def op() -> None:
        # A Redis Cluster has the three streams in different slots, so no MULTI there: the
        # rejects and the record first, the acknowledgement after them (a retry after a failure
        # between the two may write a reject twice, never lose one).
        pipe = client.pipeline(transaction=not cluster)
        for eid, fields, r in rejects:
            pipe.xadd(keys.ingest_rejects, {**_as_sent(fields), "_reason": r.reason, "_detail": str(r), "_stream": stream,
                                            "_entry": eid}, maxlen=REJECTS_MAXLEN, approximate=True)
        if batch_record is not None:
            pipe.xadd(keys.serve_batches, batch_record, maxlen=BATCHES_MAXLEN, approximate=True)
        if cluster:
            pipe.execute()
            pipe = client.pipeline(transaction=False)
        pipe.xack(stream, GROUP, *ids)
        if delete:
            pipe.xdel(stream, *delete)
        pipe.execute()

    def done() -> bool:
        return not client.xpending_range(stream, GROUP, min=ids[0], max=ids[0], count=1)

    with_retries(op, f"acknowledging {len(ids)} entries of {stream}", url, before_retry=done)


def _as_sent(fields: dict) -> dict:
    """``fields`` with each string back in the bytes it was sent as (a reply decoded with
    ``surrogateescape``: hiredis encodes strictly, so a lone surrogate would fail the write)."""
    return {(k.encode("utf-8", "surrogateescape") if isinstance(k, str) else k):
            (v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v) for k, v in fields.items()}
