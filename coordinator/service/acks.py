"""Acknowledging ingest entries exactly once, with their rejects (the stream protocol's last step)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis
from redis.cluster import RedisCluster

from knnmon.connection import with_retries
from knnmon.protocol import GROUP
from knnmon.errors import Rejected
from knnmon.keys import Keys

__all__ = ["BATCHES_MAXLEN", "EntryFields", "REJECTS_MAXLEN", "REJECT_FIELDS", "REJECT_FIELD_BYTES", "acknowledge",
           "reject_record"]

#: Approximate caps of the service's own streams (XADD MAXLEN ~).
REJECTS_MAXLEN = 1_000_000
BATCHES_MAXLEN = 100_000
#: A reject record keeps at most this many of the entry's fields, each name and value cut to
#: this many bytes: the rejects stream holds up to :data:`REJECTS_MAXLEN` records, and hostile
#: entries (a 64 KiB field, many fields) would otherwise make it grow by what they sent, bound
#: only at tens of GB (docs/window.md, the chaos soak's memory).
REJECT_FIELDS = 16
REJECT_FIELD_BYTES = 1024

#: The fields of an entry knnmon appends to a stream (``XADD``): each name to a string or a number.
EntryFields = Mapping[str, str | int | float]


def acknowledge(client: redis.Redis, url: str, keys: Keys, stream: str, ids: Sequence[str],
                rejects: Sequence[tuple[str, dict, Rejected]], batch_record: EntryFields | None = None, *,
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
            pipe.xadd(keys.ingest_rejects, reject_record(fields, r.reason, str(r), stream, eid),
                      maxlen=REJECTS_MAXLEN, approximate=True)
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


def reject_record(fields: dict, reason: str, detail: str, stream: str, entry: str) -> dict[bytes, bytes]:
    """The ``ingest:rejects`` record of a rejected entry: its fields as they were sent, plus
    ``_reason``, ``_detail``, ``_stream``, ``_entry``.

    Always valid UTF-8, so that any client reads it (redis-py with ``decode_responses=True``
    among them): a name or value that was not UTF-8 has each byte that does not decode written as
    ``\\xNN``, and ``_escaped`` lists each such field as ``name:bytes sent``.

    Bounded whatever the entry: the first :data:`REJECT_FIELDS` fields (not ``_``-prefixed
    names the record uses itself), each name and value cut to :data:`REJECT_FIELD_BYTES` bytes at
    a character boundary; ``_truncated`` lists each cut field as ``name:bytes sent`` and
    ``_fields_left_out`` counts the fields not kept.
    """
    out: dict[bytes, bytes] = {}
    cut, escaped, left = [], [], 0
    for k, v in fields.items():
        (key, _, key_escaped), (value, value_sent, value_escaped) = _text(k), _text(v)
        if key in _OWN:
            key = b"_" + key  # (never overwrite the record's own fields)
        if len(out) >= REJECT_FIELDS or key in out:
            left += 1
            continue
        if len(key) > REJECT_FIELD_BYTES or len(value) > REJECT_FIELD_BYTES:
            cut.append(_head(key, 64) + b":" + str(value_sent).encode())
            key, value = _head(key, REJECT_FIELD_BYTES), _head(value, REJECT_FIELD_BYTES)
            if key in out:
                left += 1
                continue
        if key_escaped or value_escaped:
            escaped.append(_head(key, 64) + b":" + str(value_sent).encode())
        out[key] = value
    out.update({b"_reason": _text(reason)[0], b"_detail": _head(_text(detail)[0], REJECT_FIELD_BYTES),
                b"_stream": _text(stream)[0], b"_entry": _text(entry)[0]})
    if cut:
        out[b"_truncated"] = b",".join(cut)
    if escaped:
        out[b"_escaped"] = b",".join(escaped)
    if left:
        out[b"_fields_left_out"] = str(left).encode()
    return out


_OWN = (b"_reason", b"_detail", b"_stream", b"_entry", b"_truncated", b"_escaped", b"_fields_left_out")


def _sent(x) -> bytes:
    """A field name or value as the bytes it was sent as (a reply decoded with
    ``surrogateescape`` turned back into its bytes; a lone surrogate as its UTF-8 form)."""
    if isinstance(x, bytes):
        return x
    try:
        return str(x).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate not from surrogateescape (JSON's "\ud800")
        return str(x).encode("utf-8", "surrogatepass")


def _text(x) -> tuple[bytes, int, bool]:
    """A field name or value as valid UTF-8 (bytes that do not decode as ``\\xNN``), the
    number of bytes it was sent as, and whether any byte was escaped."""
    raw = _sent(x)
    try:
        raw.decode("utf-8")
        return raw, len(raw), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace").encode("utf-8"), len(raw), True


def _head(b: bytes, n: int) -> bytes:
    """At most the first ``n`` bytes of ``b``, not ending inside a UTF-8 character."""
    if len(b) <= n:
        return b
    end = n
    while end > 0 and (b[end] & 0xC0) == 0x80:  # (b[end] continues the character before it)
        end -= 1
    return b[:end]
