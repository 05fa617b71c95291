"""The oracle check: results in Redis against the brute-force oracle (exact haversine kNN)."""

from __future__ import annotations

import math

import pyarrow as pa

from knnmon.connection import connect
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.results import ResultReader

__all__ = ["mismatches"]


def mismatches(redis_url: str, namespace: str, queries: pa.Table, objects: pa.Table, *,
               rel: float = 1e-6, chunk: int = 10_000) -> list[str]:
    """Ids of the queries whose ``{namespace}:result:{qid}`` differs from the oracle's kNN.

    Parameters
    ----------
    queries
        ``id``, ``lon``, ``lat``, ``keywords``, ``k``.
    objects
        Every object streamed so far (``id``, ``lon``, ``lat``, ``keywords``).
    rel
        Relative tolerance on distances (meters); ids must match in order (ties by id).
    """
    oracle, keys = BruteForceKnn(objects), Keys(namespace)
    client = connect(redis_url)
    bad: list[str] = []
    try:
        rows = queries.select(["id", "lon", "lat", "keywords", "k"]).to_pylist()
        results = ResultReader(client, keys, chunk=chunk).many([r["id"] for r in rows])
        for r, (_, _, got) in zip(rows, results):
            want = oracle.knn(r["lon"], r["lat"], r["keywords"], r["k"])
            if [o for o, _ in got] != [o for o, _ in want] or not all(
                    math.isclose(g, w, rel_tol=rel, abs_tol=1e-9) for (_, g), (_, w) in zip(got, want)):
                bad.append(r["id"])
    finally:
        client.close()
    return bad
