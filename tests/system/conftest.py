"""System tests: the soak and the chaos soak, minutes to an hour on the real places, their
thresholds asserted (``-m system``; deselected by default, like ``slow``).

Data: ``$KNNMON_SYSTEM_OBJECTS`` (an ingest output of all places) and ``$KNNMON_SYSTEM_QUERIES``
(a query file of at least 110,000 queries), else both made here from the shared data (about 3
minutes). Lengths: ``$KNNMON_SOAK_S`` and ``$KNNMON_CHAOS_S`` seconds of publishing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def system_data(request, tmp_path_factory) -> tuple[str, str]:
    """``(objects directory, query file)`` of all places and 110,000 of the paper's queries."""
    objects, queries = os.environ.get("KNNMON_SYSTEM_OBJECTS"), os.environ.get("KNNMON_SYSTEM_QUERIES")
    if objects and queries:
        return objects, queries
    shared: Path = request.getfixturevalue("shared_data")
    request.getfixturevalue("spark")
    from knnmon.ingest.jobs import ingest_places
    from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
    from knnmon.ingest.reading import read_objects

    root = tmp_path_factory.mktemp("system")
    ingest_places([str(shared / "places")], str(root / "objects"))
    write_queries(generate_queries(read_objects(str(root / "objects")), QueryWorkload(n=110_000, k_max=10, seed=0)),
                  str(root / "queries.parquet"))
    return str(root / "objects"), str(root / "queries.parquet")
