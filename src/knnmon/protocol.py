"""The stream protocol: how clients talk to ``knnmon serve`` through Redis streams.

Both the service and the Python client (:class:`knnmon.client.KnnClient`) import this module;
it imports only ``redis`` and knnmon's light core, so a client does not load numpy, Ray or Spark.

Streams (key names: :class:`knnmon.keys.Keys`), read by the consumer group :data:`GROUP`:

- ``knn:ingest:objects``: ``id``, ``lon``, ``lat`` (WGS84 degrees), ``t`` (optional, epoch
  ms; default: the entry id's time, i.e. when Redis took the entry; at most ``--max-future``
  ahead of it, and the entry id's time at most that far ahead of Redis's clock when the
  service reads it: else rejected as ``future``), and ``keywords``
  (space-separated terms, already normalised: used as given, lower-cased) or ``text`` (raw
  text, normalised by :func:`~knnmon.keywords.normalize_keywords`, as the ingest does).
- ``knn:ingest:queries``: ``op=register`` with ``id`` (no ``{`` or ``}``), ``lon``, ``lat``, ``keywords``
  (space-separated terms, normalised) and ``k`` (integer ``>= 1``); or ``op=unregister`` with
  ``id``.
- ``knn:ingest:rejects`` (written by the service): a rejected entry's original fields plus
  ``_reason`` (a key of :data:`~knnmon.errors.REJECT_REASONS`), ``_detail``, ``_stream``,
  ``_entry``.

Every entry either parses (:func:`parse_object`, :func:`parse_query_op`) or is rejected with one
reason (:class:`~knnmon.errors.Rejected`). An entry is acknowledged only once its effect is in Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from knnmon.errors import REJECT_REASONS, InvalidQueryError, Rejected
from knnmon.limits import (DEFAULT_LIMITS, Limits, check_fields, check_future, check_keywords, parse_id, parse_point,
                           parse_query_id, parse_time)
from knnmon.query import Query

__all__ = ["GROUP", "OBJECT_FIELDS", "QUERY_FIELDS", "REJECT_FIELDS", "REJECT_REASONS", "ObjectEntry", "QueryOp",
           "Rejected", "entry_order", "entry_time_ms", "group_info", "parse_object", "parse_query_op", "redis_clock_ms"]

#: The consumer group ``knnmon serve`` reads both ingest streams with.
GROUP = "knnmon"
#: Fields of an ``ingest:objects`` entry (``keywords`` or ``text``; ``t`` optional).
OBJECT_FIELDS = ("id", "lon", "lat", "t", "keywords", "text")
#: Fields of an ``ingest:queries`` entry (``op`` is ``register`` or ``unregister``).
QUERY_FIELDS = ("op", "id", "lon", "lat", "keywords", "k")
#: Fields the service adds to a rejected entry in ``ingest:rejects``.
REJECT_FIELDS = ("_reason", "_detail", "_stream", "_entry")


@dataclass(frozen=True)
class ObjectEntry:
    """A parsed object: string id, degrees, epoch ms, sorted unique keywords."""

    id: str
    lon: float
    lat: float
    t: int
    keywords: tuple[str, ...]


@dataclass(frozen=True)
class QueryOp:
    """A parsed query operation: ``op`` and ``id``; ``query`` for ``register`` only."""

    op: str
    id: str
    query: Query | None = None


def entry_time_ms(entry_id: str) -> int:
    """The millisecond time part of a stream entry id (``"1700000000000-3"`` -> 1700000000000)."""
    return int(entry_id.split("-", 1)[0])


def redis_clock_ms(client: Any) -> int:
    """Redis's clock (``TIME``), epoch ms: the clock entry ids are made from. In a Redis Cluster,
    the latest of the masters' clocks."""
    got = client.time()
    clocks = list(got.values()) if isinstance(got, dict) else [got]
    return max(int(sec) * 1000 + int(usec) // 1000 for sec, usec in clocks)


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable ``(ms, sequence)`` pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def group_info(client: Any, key: str) -> dict[str, Any] | None:
    """XINFO GROUPS of stream ``key`` for the group :data:`GROUP` (``pending``,
    ``last-delivered-id``, ...); ``None`` if the stream or the group does not exist."""
    if not client.exists(key):
        return None
    return next((g for g in client.xinfo_groups(key) if g["name"] == GROUP), None)


def _point(fields: Mapping[str, str]) -> tuple[float, float]:
    if fields.get("lon") in (None, "") or fields.get("lat") in (None, ""):
        raise Rejected("missing_coordinates")
    return parse_point(fields["lon"], fields["lat"])


def parse_object(entry_id: str, fields: Mapping[str, str], limits: Limits = DEFAULT_LIMITS, *,
                 clock_ms: int | None = None) -> ObjectEntry:
    """Parse one ``knn:ingest:objects`` entry (module docstring; bounds of :mod:`knnmon.limits`).

    The entry's arrival time is its id's time. ``t`` may lead it by at most
    ``limits.max_future_ms``; with ``clock_ms`` (Redis's clock when the entry was read, epoch
    ms), the arrival may lead that clock by at most as much too: a client may XADD with an
    explicit id, and an entry without ``t`` takes its id's time.

    Raises
    ------
    Rejected
        With the first problem found, in the order of :data:`REJECT_REASONS`.
    """
    check_fields(fields)
    oid = parse_id(fields.get("id"))
    lon, lat = _point(fields)
    t_raw = fields.get("t")
    arrival = entry_time_ms(entry_id)
    t = parse_time(arrival if t_raw in (None, "") else t_raw)  # (an explicit entry id may lie past int64 too)
    if clock_ms is not None and limits.max_future_ms is not None and arrival - clock_ms > limits.max_future_ms:
        raise Rejected("future", f"the entry id's time {arrival} is {arrival - clock_ms:,} ms ahead of Redis's clock "
                                 f"({clock_ms}); at most {limits.max_future_ms:,} ms (--max-future)")
    check_future(t, arrival, limits.max_future_ms, "its arrival, the entry id's time")
    if fields.get("keywords"):
        words = sorted(set(fields["keywords"].lower().split()))
    else:
        from knnmon.keywords import normalize_keywords  # nltk: only where raw text is parsed

        words = normalize_keywords(fields.get("text"))
    return ObjectEntry(oid, lon, lat, t, tuple(check_keywords(words, limits)))


def parse_query_op(fields: Mapping[str, str], limits: Limits = DEFAULT_LIMITS) -> QueryOp:
    """Parse one ``knn:ingest:queries`` entry (module docstring); a register's query is
    validated and normalised by :meth:`Query.create` within ``limits``.

    Raises
    ------
    Rejected
        Unknown ``op``, missing id, bad coordinates, ``k`` not an integer ``>= 1``, or no keyword
        after normalisation.
    """
    check_fields(fields)
    op = (fields.get("op") or "").strip().lower()
    if op not in ("register", "unregister"):
        raise Rejected("unknown_op", f"op={str(fields.get('op'))[:64]!r}")
    qid = parse_query_id(fields.get("id"))
    if op == "unregister":
        return QueryOp("unregister", qid)
    lon, lat = _point(fields)
    try:
        query = Query.create(qid, lon, lat, fields.get("keywords"), fields.get("k"), limits=limits)
    except InvalidQueryError as ex:
        raise Rejected(ex.reason, ex.detail) from None
    return QueryOp("register", qid, query)
