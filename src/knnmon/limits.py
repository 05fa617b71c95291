"""The rules and bounds on every field that enters knnmon: one place, used by the stream
protocol (objects and query operations), :meth:`knnmon.query.Query.create`, query files and the
client. A field that breaks one is rejected with a reason of :data:`~knnmon.errors.REJECT_REASONS`
(:class:`~knnmon.errors.Rejected`), so that no input can make knnmon allocate without bound or
fail later, inside a worker.

Light (no numpy): the Python client uses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from knnmon.errors import InvalidArgumentError, Rejected

__all__ = ["DEFAULT_LIMITS", "DEFAULT_MAX_FUTURE_MS", "INT64_MAX", "INT64_MIN", "MAX_FIELD_BYTES", "MAX_ID_BYTES",
           "Limits", "check_fields", "check_future", "check_keywords", "parse_id", "parse_k", "parse_point", "parse_query_id",
           "parse_time"]

#: Longest id, in UTF-8 bytes.
MAX_ID_BYTES = 256
#: Longest field of a stream entry, in bytes (64 KiB).
MAX_FIELD_BYTES = 64 * 1024
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
#: How far an object's ``t`` may lead its arrival time by default (``--max-future``): 1 minute.
DEFAULT_MAX_FUTURE_MS = 60_000


@dataclass(frozen=True)
class Limits:
    """Bounds a deployment sets (``limits.max_k``, ``limits.max_keywords``).

    Attributes
    ----------
    max_k : int
        Largest ``k`` of a query (default 1,000): a worker's memory grows with its queries' k.
    max_keywords : int
        Most keywords of a query or an object after normalisation (default 32).
    max_future_ms : int or None
        How far an object's ``t`` may lead its arrival time, ms (default 60,000:
        ``--max-future 1m``; ``None``: ``--max-future off``, no bound): :func:`check_future`.

    Raises
    ------
    InvalidArgumentError
        A bound below 1, or a negative ``max_future_ms``.
    """

    max_k: int = 1000
    max_keywords: int = 32
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise InvalidArgumentError(f"limits.max_k must be >= 1; got {self.max_k}")
        if self.max_keywords < 1:
            raise InvalidArgumentError(f"limits.max_keywords must be >= 1; got {self.max_keywords}")
        if self.max_future_ms is not None and self.max_future_ms < 0:
            raise InvalidArgumentError(f"--max-future must be >= 0 or off; got {self.max_future_ms} ms")


DEFAULT_LIMITS = Limits()

#: Any whitespace character (``\s`` on a str pattern is exactly ``str.isspace``).
_SPACE = re.compile(r"\s")


def check_fields(fields: Mapping[Any, Any]) -> None:
    """Every field of an entry at most :data:`MAX_FIELD_BYTES` long.

    Raises
    ------
    Rejected
        ``field_too_large`` or ``not_utf8`` (a lone surrogate), naming the field.
    """
    for key, value in fields.items():
        if value.__class__ is str and value.isascii() and len(value) <= MAX_FIELD_BYTES:
            continue  # (the common case, decided at once: ASCII text is its own UTF-8)
        text = value if isinstance(value, bytes) else str(value)
        if len(text) > MAX_FIELD_BYTES:
            raise Rejected("field_too_large", f"field {str(key)[:64]!r} exceeds {MAX_FIELD_BYTES:,} bytes")
        try:
            size = len(text) if isinstance(text, bytes) else len(text.encode())
        except UnicodeEncodeError:  # bytes that were not UTF-8 (read with surrogateescape), or JSON's "\ud800"
            raise Rejected("not_utf8", f"field {str(key)[:64]!r} is not UTF-8 text") from None
        if size > MAX_FIELD_BYTES:
            raise Rejected("field_too_large", f"field {str(key)[:64]!r} exceeds {MAX_FIELD_BYTES:,} bytes")


def parse_id(raw: Any) -> str:
    """An object or query id: leading and trailing blanks removed, non-empty, at most
    :data:`MAX_ID_BYTES` bytes, no whitespace or control character inside.

    Raises
    ------
    Rejected
        ``missing_id`` (empty) or ``bad_id``.
    """
    oid = str(raw).strip() if raw is not None else ""
    if not oid:
        raise Rejected("missing_id")
    if len(oid) > MAX_ID_BYTES:  # (before looking at each character: at most 4 bytes each)
        raise Rejected("bad_id", f"id of {len(oid):,} characters (at most {MAX_ID_BYTES} bytes)")
    if not oid.isprintable() or _SPACE.search(oid):  # (a lone surrogate is not printable)
        raise Rejected("bad_id", f"id={oid[:64]!r} holds whitespace, a control character or a lone surrogate")
    if len(oid.encode()) > MAX_ID_BYTES:
        raise Rejected("bad_id", f"id of {len(oid.encode()):,} bytes (at most {MAX_ID_BYTES})")
    return oid


def parse_query_id(raw: Any) -> str:
    """A query id: :func:`parse_id`, and no ``{`` or ``}``. A query's id becomes part of Redis
    keys (``knn:result:{qid}``); braces there would be a Redis Cluster hash tag, which lets one
    client pin any number of results to one master of a cluster.

    Raises
    ------
    Rejected
        ``missing_id`` or ``bad_id``.
    """
    qid = parse_id(raw)
    if "{" in qid or "}" in qid:
        raise Rejected("bad_id", f"query id={qid[:64]!r} holds {{ or }} (a Redis Cluster hash tag in its keys)")
    return qid


def check_future(t: int, arrival_ms: int, max_future_ms: int | None, arrival: str = "its arrival") -> int:
    """``t`` if it leads ``arrival_ms`` (both epoch ms) by at most ``max_future_ms`` (``None``:
    no bound). An object further ahead would move the watermark past every honest object.

    Raises
    ------
    Rejected
        ``future``, with both times and the bound.
    """
    if max_future_ms is not None and t - arrival_ms > max_future_ms:
        raise Rejected("future", f"t={t} is {t - arrival_ms:,} ms ahead of {arrival} ({arrival_ms}); at most "
                                 f"{max_future_ms:,} ms (--max-future)")
    return t


def parse_point(lon: Any, lat: Any) -> tuple[float, float]:
    """``(lon, lat)`` as float degrees: finite, ``|lon| <= 180``, ``|lat| <= 90``, not (0, 0).

    Raises
    ------
    Rejected
        ``non_numeric_coordinates``, ``longitude_out_of_range``, ``latitude_out_of_range``, or
        ``null_island`` (exactly (0, 0): what a device reports without a position).
    """
    try:
        x, y = float(lon), float(lat)
    except (TypeError, ValueError, OverflowError):
        raise Rejected("non_numeric_coordinates", f"lon={str(lon)[:64]!r}, lat={str(lat)[:64]!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise Rejected("non_numeric_coordinates", f"lon={x}, lat={y}")
    if abs(x) > 180:
        raise Rejected("longitude_out_of_range", f"lon={x}")
    if abs(y) > 90:
        raise Rejected("latitude_out_of_range", f"lat={y}")
    if x == 0 and y == 0:
        raise Rejected("null_island", "lon=0, lat=0")
    return x, y


def parse_k(k: Any, limits: Limits = DEFAULT_LIMITS) -> int:
    """``k`` as an int in ``[1, limits.max_k]``.

    Raises
    ------
    Rejected
        ``bad_k`` (not an integer, or below 1) or ``k_too_large``.
    """
    if isinstance(k, float) and not k.is_integer():
        raise Rejected("bad_k", f"k={k!r}")
    try:
        kk = int(k)
    except (TypeError, ValueError, OverflowError):
        raise Rejected("bad_k", f"k={str(k)[:64]!r}") from None
    if kk < 1:
        raise Rejected("bad_k", f"k={kk}")
    if kk > limits.max_k:
        raise Rejected("k_too_large", f"k={kk} (at most {limits.max_k:,}: limits.max_k)")
    return kk


def parse_time(t: Any) -> int:
    """An epoch-millisecond time that fits int64.

    Raises
    ------
    Rejected
        ``bad_time``.
    """
    try:
        ms = int(t)
    except (TypeError, ValueError, OverflowError):
        raise Rejected("bad_time", f"t={str(t)[:64]!r}") from None
    if not INT64_MIN <= ms <= INT64_MAX:
        raise Rejected("bad_time", f"t={str(t)[:64]} does not fit 64 bits")
    return ms


def check_keywords(words: Sequence[str], limits: Limits = DEFAULT_LIMITS) -> Sequence[str]:
    """``words`` if there are 1 to ``limits.max_keywords`` of them.

    Raises
    ------
    Rejected
        ``no_keywords`` or ``too_many_keywords``.
    """
    if not words:
        raise Rejected("no_keywords")
    if len(words) > limits.max_keywords:
        raise Rejected("too_many_keywords",
                       f"{len(words):,} keywords (at most {limits.max_keywords}: limits.max_keywords)")
    return words
