"""knnmon: exact, distributed kNN monitoring of spatial-keyword queries over geo-tagged streams.

The package is split by architecture (see ``SPEC.md`` in the project's shared folder):

- :mod:`knnmon.ingest` -- PySpark jobs: raw places/tweets -> objects, keyword statistics, queries.
- :mod:`knnmon.assignment` -- load model and query-to-worker assignment (pure numpy).
- :mod:`knnmon.workers` -- the Ray actor keeping each query's kNN exact.
- :mod:`knnmon.coordinator` -- plans, routes object batches, the ``knnmon`` CLI.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
