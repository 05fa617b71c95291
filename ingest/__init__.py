"""Preprocessing on PySpark: raw places and tweets -> clean objects, keyword statistics, queries.

Outputs of ``knnmon ingest ... --out DIR`` (the contract later stages read):

- ``DIR/objects.parquet`` -- ``id`` string, ``lon``/``lat`` float64 degrees, ``t`` int64 epoch ms,
  ``keywords`` list<string> (sorted, unique, normalised by :func:`normalize_keywords`).
- ``DIR/rejects/`` -- JSON lines ``{"reason", "source", "record"}``, one per rejected input record.
- ``DIR/stats.parquet`` -- ``cell``, ``cx``, ``cy`` int32, ``keyword`` string, ``count`` int64:
  objects in grid cell ``cell`` carrying ``keyword`` (grid in ``manifest.json``, see
  :class:`~knnmon.grid.Grid`).
- ``DIR/manifest.json`` -- counts (read = kept + rejected, by reason), vocabulary, bounding box,
  grid, inputs, elapsed seconds.
"""

from __future__ import annotations

from knnmon.grid import Grid
from knnmon.keywords import normalize_keywords, stop_words

__all__ = ["Grid", "normalize_keywords", "stop_words"]
