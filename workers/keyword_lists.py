"""The single-process reference's index: keyword inverted lists, no spatial pruning.

What a user might write instead of knnmon (``docs/concepts.md``, first row of the worker-index table):
keyword -> queries lists, every query sharing a keyword with an object is a candidate wherever
it is. ``knnmon bench`` runs it in one process, with no assignment, on the same stream, to show
what the keyword-aware spatial index and the distribution buy. Same interface as
:class:`~knnmon.workers.query_index.QueryIndex`, so the worker's exact checks, top-k merge and
Redis writes are shared.
"""

from __future__ import annotations

import numpy as np

from knnmon.workers.query_index import QueryIndex, pretested

__all__ = ["KeywordLists"]


class KeywordLists(QueryIndex):
    """Keyword inverted lists over query slots (module docstring); regions are ignored."""

    def _cover(self, lon, lat, radius_m) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """One cover for every region (a region's change changes no entry)."""
        return (), np.zeros(len(np.atleast_1d(lon)), dtype=np.int64)

    def _grid_entries(self, slot, code, cover: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        """One entry per (query, keyword), keyed by the keyword code alone."""
        return np.asarray(code, dtype=np.int64).copy(), np.asarray(slot, dtype=np.int64)

    def candidates(self, lon: np.ndarray, lat: np.ndarray, pair_obj: np.ndarray, pair_code: np.ndarray,
                   reach: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every (object, query slot) pair sharing a keyword (``(c,)`` int64 each), with ``reach``
        those that pass the pre-test (:meth:`QueryIndex.candidates`)."""
        obj, slot = self._grid_hits(np.asarray(pair_code, dtype=np.int64), np.asarray(pair_obj, dtype=np.int64))
        return (obj, slot) if reach is None else pretested(lon, lat, obj, slot, reach)
