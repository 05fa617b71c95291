"""A kNN spatial-keyword query, validated and normalised once, where it enters knnmon.

Queries enter through a stream entry (:mod:`knnmon.protocol`), a query file
(:func:`knnmon.ingest.reading.load_queries`, vectorised over the whole file) or the Python API
(:meth:`Query.create`). Everything downstream (runtime registration, the workers) takes them as
they are. This module imports nothing heavy, so the light client can use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from knnmon.errors import InvalidQueryError, Rejected
from knnmon.limits import DEFAULT_LIMITS, Limits, check_keywords, parse_k, parse_point, parse_query_id

__all__ = ["Query", "QueryColumns", "invalid_query"]


@contextlib.contextmanager
def invalid_query(qid: Any) -> Iterator[None]:
    """A :class:`~knnmon.errors.Rejected` raised inside becomes an
    :class:`~knnmon.errors.InvalidQueryError` naming query ``qid``, with the same reason and detail
    (the API's error for a rule of :mod:`knnmon.limits`)."""
    try:
        yield
    except Rejected as r:
        name = str(qid).strip()[:64] if qid is not None else ""
        raise InvalidQueryError(f"query {name!r}: {r}", r.reason, r.detail) from None


@dataclass(frozen=True)
class Query:
    """``q = (id, lon, lat, keywords, k)`` (``docs/concepts.md``, "Semantics").

    Attributes
    ----------
    id : str
        Non-empty, at most 256 bytes, no whitespace.
    lon, lat : float
        WGS84 degrees, ``|lon| <= 180``, ``|lat| <= 90``, not (0, 0).
    keywords : tuple of str
        Normalised (:func:`knnmon.keywords.normalize_keywords`), sorted, unique, 1 to
        ``max_keywords`` of them.
    k : int
        ``1 <= k <= max_k``.

    Two queries with equal fields are equal: a register of an existing query with equal
    parameters changes nothing (``knnmon serve``).
    """

    id: str
    lon: float
    lat: float
    keywords: tuple[str, ...]
    k: int

    @classmethod
    def create(cls, id: Any, lon: Any, lat: Any, keywords: str | Sequence[str] | None, k: Any, *,
               limits: Limits = DEFAULT_LIMITS) -> Query:
        """Validate and normalise a query's parameters (the rules of :mod:`knnmon.limits`).

        ``keywords``: a string (any text, normalised as the ingest normalises objects) or a
        sequence of terms (joined with spaces, then normalised).

        Raises
        ------
        InvalidQueryError
            The first problem, in this order: the id (empty, too long, whitespace, ``{`` or ``}``), the
            coordinates (not finite, out of range, (0, 0)), ``k`` (not an integer in
            ``[1, limits.max_k]``), the keywords (none left after normalisation, or more than
            ``limits.max_keywords``); its ``reason`` is a key of :data:`~knnmon.errors.REJECT_REASONS`.
        """
        from knnmon.keywords import normalize_keywords  # nltk: imported on first use only

        with invalid_query(id):
            qid = parse_query_id(id)
            lon_f, lat_f = parse_point(lon, lat)
            k_i = parse_k(k, limits)
            text = keywords if isinstance(keywords, str) or keywords is None else " ".join(map(str, keywords))
            words = tuple(check_keywords(normalize_keywords(text), limits))
        return cls(qid, lon_f, lat_f, words, k_i)

    @classmethod
    def from_hash(cls, qid: str, fields: Mapping[str, str]) -> Query:
        """The query stored in hash ``knn:query:{qid}`` (as its worker wrote it: validated when
        it was registered).

        Raises
        ------
        KeyError, ValueError
            A field missing or unreadable.
        """
        return cls(qid, float(fields["lon"]), float(fields["lat"]), tuple(fields["keywords"].split()), int(fields["k"]))


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

    def take(self, rows: Sequence[int]) -> QueryColumns:
        """The queries ``rows`` (indices), in that order."""
        import numpy as np

        idx = np.asarray(rows, dtype=np.int64)
        sel = idx.tolist()
        return QueryColumns([self.ids[i] for i in sel], np.asarray(self.lon, dtype=np.float64)[idx],
                            np.asarray(self.lat, dtype=np.float64)[idx], [self.keywords[i] for i in sel],
                            np.asarray(self.k, dtype=np.int64)[idx])

    @classmethod
    def of(cls, queries: Sequence[Query]) -> QueryColumns:
        """The columns of a list of queries."""
        return cls([q.id for q in queries], [q.lon for q in queries], [q.lat for q in queries],
                   [q.keywords for q in queries], [q.k for q in queries])

    def to_table(self):
        """A pyarrow table of a query file's columns (``id`` string, ``lon``, ``lat`` float64,
        ``keywords`` list<string>, ``k`` int32). pyarrow is imported here only: the light client
        imports this module."""
        import pyarrow as pa

        return pa.table({"id": pa.array([str(x) for x in self.ids], pa.string()),
                         "lon": pa.array(list(self.lon), pa.float64()), "lat": pa.array(list(self.lat), pa.float64()),
                         "keywords": pa.array([list(w) for w in self.keywords], pa.list_(pa.string())),
                         "k": pa.array([int(x) for x in self.k], pa.int32())})
