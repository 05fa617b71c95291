"""A kNN spatial-keyword query, validated and normalised once, where it enters knnmon.

Queries enter through a stream entry (:mod:`knnmon.coordinator.service.protocol`), a query file
(:func:`knnmon.ingest.reading.load_queries`, vectorised over the whole file) or the Python API
(:meth:`Query.create`). Everything downstream (runtime registration, the workers) takes them as
they are. This module imports nothing heavy, so the light client can use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from knnmon.errors import InvalidQueryError, Rejected

__all__ = ["Query", "QueryColumns", "parse_k", "parse_point"]


def parse_point(lon: Any, lat: Any) -> tuple[float, float]:
    """``(lon, lat)`` as float degrees, checked: finite, ``|lon| <= 180``, ``|lat| <= 90``.
    The one place these rules live (queries, and objects of the stream protocol).

    Raises
    ------
    Rejected
        ``non_numeric_coordinates``, ``longitude_out_of_range`` or ``latitude_out_of_range``.
    """
    try:
        x, y = float(lon), float(lat)
    except (TypeError, ValueError):
        raise Rejected("non_numeric_coordinates", f"lon={lon!r}, lat={lat!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise Rejected("non_numeric_coordinates", f"lon={x}, lat={y}")
    if abs(x) > 180:
        raise Rejected("longitude_out_of_range", f"lon={x}")
    if abs(y) > 90:
        raise Rejected("latitude_out_of_range", f"lat={y}")
    return x, y


def parse_k(k: Any) -> int:
    """``k`` as an int ``>= 1``.

    Raises
    ------
    Rejected
        ``bad_k``: not an integer, or below 1.
    """
    try:
        kk = int(k)
    except (TypeError, ValueError):
        raise Rejected("bad_k", f"k={k!r}") from None
    if kk < 1:
        raise Rejected("bad_k", f"k={kk}")
    return kk


@dataclass(frozen=True)
class Query:
    """``q = (id, lon, lat, keywords, k)`` (``SPEC.md``, "Semantics").

    Attributes
    ----------
    id : str
        Non-empty.
    lon, lat : float
        WGS84 degrees, ``|lon| <= 180``, ``|lat| <= 90``.
    keywords : tuple of str
        Normalised (:func:`knnmon.ingest.keywords.normalize_keywords`), sorted, unique, at least one.
    k : int
        ``>= 1``.

    Two queries with equal fields are equal: a register of an existing query with equal
    parameters changes nothing (``knnmon serve``).
    """

    id: str
    lon: float
    lat: float
    keywords: tuple[str, ...]
    k: int

    @classmethod
    def create(cls, id: Any, lon: Any, lat: Any, keywords: str | Sequence[str] | None, k: Any) -> Query:
        """Validate and normalise a query's parameters.

        ``keywords``: a string (any text, normalised as the ingest normalises objects) or a
        sequence of terms (joined with spaces, then normalised).

        Raises
        ------
        InvalidQueryError
            The first problem, in this order: an empty id, coordinates not finite or out of
            range, ``k`` not an integer ``>= 1``, no keyword left after normalisation; its
            ``reason`` is a key of :data:`~knnmon.errors.REJECT_REASONS`.
        """
        from knnmon.ingest.keywords import normalize_keywords  # nltk: imported on first use only

        qid = str(id).strip() if id is not None else ""
        try:
            if not qid:
                raise Rejected("missing_id")
            lon_f, lat_f = parse_point(lon, lat)
            k_i = parse_k(k)
            text = keywords if isinstance(keywords, str) or keywords is None else " ".join(map(str, keywords))
            words = tuple(normalize_keywords(text))
            if not words:
                raise Rejected("no_keywords", f"keywords={keywords!r}")
        except Rejected as r:
            raise InvalidQueryError(f"query {qid!r}: {r}", r.reason, r.detail) from None
        return cls(qid, lon_f, lat_f, words, k_i)


@dataclass(frozen=True)
class QueryColumns:
    """``m`` valid queries as columns, in :class:`Query`'s field order (bulk loads: a million
    queries travel to the workers without a Python object each).

    Attributes
    ----------
    ids : sequence of str, ``(m,)``
    lon, lat : ``(m,)`` float64 degrees
    keywords : sequence of ``m`` sequences of str (normalised)
    k : ``(m,)`` int64
    """

    ids: Sequence[str]
    lon: Sequence[float]
    lat: Sequence[float]
    keywords: Sequence[Sequence[str]]
    k: Sequence[int]

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, queries: Sequence[Query]) -> QueryColumns:
        """The columns of a list of queries."""
        return cls([q.id for q in queries], [q.lon for q in queries], [q.lat for q in queries],
                   [q.keywords for q in queries], [q.k for q in queries])
