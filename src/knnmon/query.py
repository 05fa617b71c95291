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

__all__ = ["Query", "QueryColumns"]


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
            An empty id, ``k`` not an integer ``>= 1``, coordinates not finite or out of range,
            or no keyword left after normalisation; the message names the query and the values.
        """
        from knnmon.errors import InvalidQueryError
        from knnmon.ingest.keywords import normalize_keywords  # nltk: imported on first use only

        qid = str(id).strip() if id is not None else ""
        text = keywords if isinstance(keywords, str) or keywords is None else " ".join(map(str, keywords))
        words = tuple(normalize_keywords(text))
        try:
            lon_f, lat_f, k_i = float(lon), float(lat), int(k)
            ok = bool(qid) and k_i >= 1 and bool(words) and abs(lon_f) <= 180 and abs(lat_f) <= 90 and \
                math.isfinite(lon_f) and math.isfinite(lat_f)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InvalidQueryError(f"query {qid!r}: needs an id, k >= 1, a keyword and valid coordinates "
                                    f"(k={k}, keywords={keywords!r}, lon={lon}, lat={lat})")
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
