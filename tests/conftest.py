"""Shared fixtures: one real SparkSession per test session, and the real data beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The project's shared data (``../shared/data`` from the checkout); override with KNNMON_SHARED_DATA.
SHARED_DATA = Path(os.environ.get("KNNMON_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``shared/data`` with ``places/`` and ``tweets/``; tests needing it skip without it."""
    if not (SHARED_DATA / "places").is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set KNNMON_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 cores), started once; ingest jobs reuse it via getOrCreate."""
    from knnmon.ingest.spark import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()

