"""Parsing the entries clients add to ``knn:ingest:objects`` and ``knn:ingest:queries``.

Every entry either parses or is rejected with one reason (:data:`REJECT_REASONS`); ``knnmon
serve`` writes rejected entries to ``knn:ingest:rejects`` with their original fields.

Objects (``knn:ingest:objects``): ``id``, ``lon``, ``lat`` (WGS84 degrees), ``t`` (optional,
epoch ms; default: the entry id's time, i.e. when Redis took the entry), and ``keywords``
(space-separated terms, already normalised: used as given, lower-cased) or ``text`` (raw text,
normalised by :func:`~knnmon.ingest.keywords.normalize_keywords`, as the ingest does).

Queries (``knn:ingest:queries``): ``op=register`` with ``id``, ``lon``, ``lat``, ``keywords``
(space-separated terms, normalised by :func:`normalize_keywords`) and ``k`` (integer ``>= 1``);
or ``op=unregister`` with ``id``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from knnmon.ingest.keywords import normalize_keywords

__all__ = ["REJECT_REASONS", "ObjectEntry", "QueryOp", "Rejected", "entry_order", "entry_time_ms", "parse_object", "parse_query_op"]

#: Why an entry is rejected.
REJECT_REASONS: dict[str, str] = {
    "missing_id": "no `id` field, or an empty one",
    "missing_coordinates": "no `lon` or `lat`",
    "non_numeric_coordinates": "`lon` or `lat` is not a finite number",
    "longitude_out_of_range": "`lon` outside [-180, 180]",
    "latitude_out_of_range": "`lat` outside [-90, 90]",
    "bad_time": "`t` is not an integer (epoch milliseconds)",
    "no_keywords": "no `keywords`/`text`, or no keyword left after normalisation",
    "duplicate_id": "an object id seen before (the first one is kept)",
    "unknown_op": "`op` is missing or not `register` / `unregister`",
    "bad_k": "`k` missing, not an integer, or below 1",
}


class Rejected(ValueError):
    """An entry that cannot be processed; ``reason`` is a key of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail or REJECT_REASONS[reason]}")
        self.reason = reason


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
    """A parsed query operation; ``lon``, ``lat``, ``keywords``, ``k`` only for ``register``."""

    op: str
    id: str
    lon: float = 0.0
    lat: float = 0.0
    keywords: tuple[str, ...] = ()
    k: int = 0


def entry_time_ms(entry_id: str) -> int:
    """The millisecond time part of a stream entry id (``"1700000000000-3"`` -> 1700000000000)."""
    return int(entry_id.split("-", 1)[0])


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable ``(ms, sequence)`` pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id(fields: Mapping[str, str]) -> str:
    oid = (fields.get("id") or "").strip()
    if not oid:
        raise Rejected("missing_id")
    return oid


def _point(fields: Mapping[str, str]) -> tuple[float, float]:
    if fields.get("lon") in (None, "") or fields.get("lat") in (None, ""):
        raise Rejected("missing_coordinates")
    try:
        lon, lat = float(fields["lon"]), float(fields["lat"])
    except ValueError:
        raise Rejected("non_numeric_coordinates", f"lon={fields['lon']!r}, lat={fields['lat']!r}") from None
    if not (math.isfinite(lon) and math.isfinite(lat)):
        raise Rejected("non_numeric_coordinates", f"lon={lon}, lat={lat}")
    if abs(lon) > 180:
        raise Rejected("longitude_out_of_range", f"lon={lon}")
    if abs(lat) > 90:
        raise Rejected("latitude_out_of_range", f"lat={lat}")
    return lon, lat


def parse_object(entry_id: str, fields: Mapping[str, str]) -> ObjectEntry:
    """Parse one ``knn:ingest:objects`` entry (module docstring).

    Raises
    ------
    Rejected
        With the first problem found, in the order of :data:`REJECT_REASONS`.
    """
    oid = _id(fields)
    lon, lat = _point(fields)
    t_raw = fields.get("t")
    if t_raw in (None, ""):
        t = entry_time_ms(entry_id)
    else:
        try:
            t = int(t_raw)
        except ValueError:
            raise Rejected("bad_time", f"t={t_raw!r}") from None
    if fields.get("keywords"):
        words = tuple(sorted(set(fields["keywords"].lower().split())))
    else:
        words = tuple(normalize_keywords(fields.get("text")))
    if not words:
        raise Rejected("no_keywords")
    return ObjectEntry(oid, lon, lat, t, words)


def parse_query_op(fields: Mapping[str, str]) -> QueryOp:
    """Parse one ``knn:ingest:queries`` entry (module docstring).

    Raises
    ------
    Rejected
        Unknown ``op``, missing id, bad coordinates, ``k`` not an integer ``>= 1``, or no keyword
        after normalisation.
    """
    op = (fields.get("op") or "").strip().lower()
    if op not in ("register", "unregister"):
        raise Rejected("unknown_op", f"op={fields.get('op')!r}")
    qid = _id(fields)
    if op == "unregister":
        return QueryOp("unregister", qid)
    lon, lat = _point(fields)
    try:
        k = int(fields.get("k", ""))
    except ValueError:
        raise Rejected("bad_k", f"k={fields.get('k')!r}") from None
    if k < 1:
        raise Rejected("bad_k", f"k={k}")
    words = tuple(normalize_keywords(fields.get("keywords")))
    if not words:
        raise Rejected("no_keywords", f"keywords={fields.get('keywords')!r}")
    return QueryOp("register", qid, lon, lat, words, k)
