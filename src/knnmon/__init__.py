"""knnmon: exact, distributed kNN monitoring of spatial-keyword queries over geo-tagged streams.

The package is split by architecture (``docs/concepts.md``, "Components"):

- :mod:`knnmon.ingest` -- PySpark jobs: raw places/tweets -> objects, keyword statistics, queries.
- :mod:`knnmon.assignment` -- load model and query-to-worker assignment (pure numpy).
- :mod:`knnmon.workers` -- the Ray actor keeping each query's kNN exact.
- :mod:`knnmon.coordinator` -- plans, routes object batches, the ``knnmon`` CLI.

This package's own modules are the core the others share (query, batch, limits, window, keys,
geometry, the stream protocol, keyword normalisation, the grid, the cost model, the oracle).
Imports flow one way: the core imports nothing above it; ``ingest``, ``assignment`` and
``workers`` import only the core; ``coordinator`` imports all of them
(``tests/test_import_direction.py``).
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
