"""The live objects in columns beside the objects stream, so that a restart parses the stream's
tail only.

A restart needs the window's live objects, and reading them back from ``knn:ingest:objects``
means parsing every entry again: ~13 us an entry, 7 s for the 500,000 of a 10-minute window at
1,000 objects/s on this machine, twice that under load. With a window the service therefore
writes, at each checkpoint (:class:`~knnmon.coordinator.recovery.checkpoint.Checkpointer`), the
objects it applied from the entries acknowledged since the last one as one **chunk**: a field of
the hash ``knn:serve:snapshot`` named by the chunk's last entry id, whose value is an Arrow IPC
stream (:data:`~knnmon.coordinator.recovery.object_log.OBJECT_SCHEMA`; its size, then the stream
packed with zstd, in base64) with its
entries' range, batch spans and the entry limits in the schema's metadata. A chunk leaves with
the trim that removes its last entry.

A start (:func:`~knnmon.coordinator.recovery.object_log.read_object_log`) takes each chunk's rows
instead of parsing its range, and parses only the entries between chunks and after the last one
(the tail since the last checkpoint, rejected entries, a range a restart recovered). A chunk is
used only if it is whole and plausible (:func:`read_chunks`): the same limits, the schema, every
id, coordinate, time and keyword list within bounds, its range after the previous chunk's and
before the last delivered entry, no pending or isolated entry in it, and its last entry id not
ahead of Redis's clock by more than ``--max-future``; otherwise its range is parsed as before.
Any client may write to Redis, so a chunk is checked like any entry, not trusted.
"""

from __future__ import annotations

import base64
import bisect
import json
import logging
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from knnmon.connection import with_retries
from knnmon.keys import Keys
from knnmon.limits import Limits
from knnmon.protocol import entry_order, entry_time_ms

__all__ = ["Chunk", "ChunkWriter", "drop_chunks", "read_chunks"]

log = logging.getLogger("knnmon.serve")

#: A chunk's Arrow stream may claim at most this many times its stored bytes (zstd packs the
#: service's chunks ~2x): the decompression allocates the claimed size, nothing more.
MAX_EXPANSION = 16
#: The ids' and keywords' longest plausible text, characters (an entry's field is bounded by
#: the entry limits far below this; a chunk beyond it is not one the service wrote).
_MAX_TEXT = 1 << 16


@dataclass
class Chunk:
    """One checkpoint's applied objects (module docstring): ``objects`` (``OBJECT_SCHEMA``)
    from the entries ``first``..``last``, with the acknowledged batches' ``spans``
    (``(first, last, largest t)``, as :meth:`Checkpointer.add` takes them)."""

    first: str
    last: str
    spans: list[tuple[str, str, int]]
    objects: pa.Table


def _limits_text(limits: Limits) -> str:
    return json.dumps(asdict(limits), sort_keys=True)


def encode(chunk: Chunk, limits: Limits) -> str:
    """The hash field's value of ``chunk`` (module docstring)."""
    meta = {"first": chunk.first, "last": chunk.last, "spans": json.dumps(chunk.spans),
            "limits": _limits_text(limits)}
    table = chunk.objects.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    raw = sink.getvalue()
    packed = pa.compress(raw, codec="zstd", asbytes=True)
    return base64.b64encode(raw.size.to_bytes(8, "little") + packed).decode("ascii")


def decode(value: str, schema: pa.Schema, limits: Limits) -> Chunk:
    """The chunk a hash field's value holds.

    Raises
    ------
    ValueError
        Not a chunk this service would write with ``limits`` (module docstring).
    """
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
        size = int.from_bytes(data[:8], "little")
        if len(data) < 8 or size > MAX_EXPANSION * len(data):  # (a zstd bomb: the allocation is bounded)
            raise ValueError(f"a stream of {size:,} bytes claimed from {len(data):,}")
        raw = pa.decompress(data[8:], decompressed_size=size, codec="zstd")
        table = pa.ipc.open_stream(raw).read_all()
    except (pa.ArrowException, UnicodeEncodeError, ValueError) as ex:
        raise ValueError(f"not an Arrow stream ({type(ex).__name__}: {str(ex)[:80]})") from None
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in (table.schema.metadata or {}).items()}
    if meta.get("limits") != _limits_text(limits):
        raise ValueError("written under other entry limits")
    table = table.replace_schema_metadata(None)
    if not table.schema.equals(schema):
        raise ValueError("another schema")
    first, last = meta.get("first", ""), meta.get("last", "")
    entry_order(first), entry_order(last)  # (ValueError unless entry ids)
    if entry_order(first) > entry_order(last):
        raise ValueError(f"entries {first}..{last}")
    spans = [(str(a), str(b), int(t)) for a, b, t in json.loads(meta.get("spans", "[]"))]
    _check_rows(table, limits)
    return Chunk(first, last, spans, table)


def _check_rows(table: pa.Table, limits: Limits) -> None:
    """Raise ValueError unless every row is an object the service could have applied."""
    if table.num_rows == 0:
        return
    for name in ("id", "lon", "lat", "t", "keywords"):
        if table.column(name).null_count:
            raise ValueError(f"a null {name}")
    lon, lat = table.column("lon").to_numpy(), table.column("lat").to_numpy()
    with np.errstate(invalid="ignore"):
        if not ((np.abs(lon) <= 180) & (np.abs(lat) <= 90)).all():
            raise ValueError("a point out of range")
    ids = table.column("id")
    lengths = pc.utf8_length(ids)
    if pc.min(lengths).as_py() < 1 or pc.max(lengths).as_py() > _MAX_TEXT:
        raise ValueError("an id empty or too long")
    counts = pc.list_value_length(table.column("keywords"))
    if pc.min(counts).as_py() < 1 or pc.max(counts).as_py() > limits.max_keywords:
        raise ValueError("a keyword list empty or too long")
    words = pc.list_flatten(table.column("keywords"))
    if words.null_count or pc.max(pc.utf8_length(words)).as_py() > _MAX_TEXT:
        raise ValueError("a keyword null or too long")


class ChunkWriter:
    """The objects applied since the last checkpoint, written as one chunk at the next
    (module docstring); :meth:`add` per acknowledged batch, :meth:`write` at a checkpoint.
    ``schema``: the chunks' (the service's
    :data:`~knnmon.coordinator.recovery.object_log.OBJECT_SCHEMA`)."""

    def __init__(self, client: redis.Redis, url: str | None, keys: Keys, limits: Limits, schema: pa.Schema) -> None:
        self.client, self.url, self.keys, self.limits, self.schema = client, url, keys, limits, schema
        self._tables: list[pa.Table] = []
        self._spans: list[tuple[str, str, int]] = []

    def add(self, first: str, last: str, top_t: int, objects: pa.Table) -> None:
        """An acknowledged batch of entries ``first``..``last`` and the objects it applied
        (the columns of ``schema``; rows with a ``t`` at or below the window's cutoff are left
        for the restart's own filter). :meth:`write` is called at a read's end only (the
        ledger's checkpoint), so a chunk holds every object of the entries it spans."""
        self._tables.append(objects.select(self.schema.names))
        self._spans.append((first, last, top_t))

    def write(self) -> bool:
        """Write the chunk of the batches added since the last write, named by their last
        entry; ``True`` if one was written.

        Raises
        ------
        StoreUnavailableError
            Redis unreachable after every retry.
        """
        tables, spans = self._tables, self._spans
        self._tables, self._spans = [], []
        if not spans:
            return False
        objects = pa.concat_tables([t.cast(self.schema) for t in tables])
        first = min((a for a, _, _ in spans), key=entry_order)
        last = max((b for _, b, _ in spans), key=entry_order)
        value = encode(Chunk(first, last, spans, objects), self.limits)
        with_retries(lambda: self.client.hset(self.keys.serve_snapshot, last, value), "writing the objects' chunk",
                     self.url)
        return True


def drop_chunks(client: redis.Redis, url: str | None, keys: Keys, below: str) -> int:
    """Delete the chunks whose last entry is below ``below`` (the stream was trimmed there);
    returns how many."""
    names = with_retries(lambda: client.hkeys(keys.serve_snapshot), "reading the objects' chunks", url)
    gone = []
    for name in names:
        try:
            if entry_order(name) < entry_order(below):
                gone.append(name)
        except ValueError:
            gone.append(name)  # (not a field the service wrote)
    if gone:
        with_retries(lambda: client.hdel(keys.serve_snapshot, *gone), "dropping the objects' chunks", url)
    return len(gone)


def read_chunks(client: redis.Redis, keys: Keys, schema: pa.Schema, limits: Limits, last_delivered: str,
                avoid: list[str], clock_ms: int | None) -> list[Chunk]:
    """The usable chunks (module docstring), in entry order, none overlapping (two that do are
    both left out): each within the
    entries delivered up to ``last_delivered``, none holding an entry of ``avoid`` (pending or
    isolated ids), none whose last entry id leads ``clock_ms`` by more than
    ``limits.max_future_ms``. Unusable ones are logged and left (their range is parsed)."""
    try:
        raw = client.hgetall(keys.serve_snapshot)
    except redis.ResponseError as ex:  # (the key is not a hash: any client may write anything)
        log.warning("objects' chunks unreadable (%s); the stream is parsed instead", ex)
        return []
    chunks, skipped = [], []
    end = entry_order(last_delivered)
    avoid_order = sorted(entry_order(e) for e in avoid)
    for name, value in raw.items():
        try:
            chunk = decode(value, schema, limits)
        except (ValueError, TypeError, KeyError, OverflowError) as ex:
            skipped.append(f"{str(name)[:40]}: {str(ex)[:80]}")
            continue
        lo, hi = entry_order(chunk.first), entry_order(chunk.last)
        if hi > end or str(name) != chunk.last:
            skipped.append(f"{chunk.last}: beyond the entries delivered, or misnamed")
        elif bisect.bisect_left(avoid_order, lo) < bisect.bisect_right(avoid_order, hi):
            skipped.append(f"{chunk.last}: holds an entry pending or isolated")
        elif clock_ms is not None and limits.max_future_ms is not None and \
                entry_time_ms(chunk.last) - clock_ms > limits.max_future_ms:
            skipped.append(f"{chunk.last}: its entries lead Redis's clock")
        else:
            chunks.append(chunk)
    chunks.sort(key=lambda c: entry_order(c.first))
    kept: list[Chunk] = []
    reach = None  # the largest last entry of the chunks so far, kept or not
    for c in chunks:
        if reach is not None and entry_order(c.first) <= reach:
            # Overlapping chunks: neither one's claim to hold every object of its range holds.
            if kept and entry_order(kept[-1].last) >= entry_order(c.first):
                skipped.append(f"{kept.pop().last}: overlapped")
            skipped.append(f"{c.last}: overlaps an earlier chunk")
        else:
            kept.append(c)
        reach = entry_order(c.last) if reach is None else max(reach, entry_order(c.last))
    if skipped:
        log.warning("%d of the objects' chunks left out, their entries parsed from the stream: %s", len(skipped),
                    "; ".join(skipped[:3]))
    return kept
