"""The worker's vectorised top-k merge against the brute-force oracle, on data full of exact ties."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.oracle import BruteForceKnn
from knnmon.query import QueryColumns
from knnmon.workers.worker import KnnWorker

WORDS = ["cafe", "bar", "park"]


def _objects(rng: np.random.Generator, n: int, start: int, prefix: str = "o") -> pa.Table:
    """Objects on a coarse grid (many share a location, so distances tie exactly); ids out of order.
    With ``prefix="object-"`` ids share their first 8 bytes, so ties are ordered by the full ids."""
    ids = [f"{prefix}{(start + i) * 7919 % 100_003:06d}" for i in range(n)]
    kws = [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(n)]
    return pa.table({"id": ids, "lon": rng.integers(-3, 4, n) * 0.01, "lat": rng.integers(-3, 4, n) * 0.01,
                     "t": np.arange(start, start + n, dtype=np.int64), "keywords": kws})


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_initial=st.integers(0, 40), batches=st.lists(st.integers(1, 30), min_size=1,
                                                                                      max_size=4),
       prefix=st.sampled_from(["o", "object-"]))
def test_merge_equals_oracle_with_ties(seed, n_initial, batches, prefix):
    rng = np.random.default_rng(seed)
    seen = _objects(rng, n_initial, 0, prefix)
    nq = 12
    q = {"id": [f"q{i}" for i in range(nq)], "lon": rng.integers(-3, 4, nq) * 0.01,
         "lat": rng.integers(-3, 4, nq) * 0.01, "k": rng.integers(1, 5, nq),
         "keywords": [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(nq)]}
    oracle = BruteForceKnn(seen) if seen.num_rows else None
    initial = [oracle.knn(q["lon"][i], q["lat"][i], q["keywords"][i], int(q["k"][i])) if oracle else []
               for i in range(nq)]
    w = KnnWorker(0)
    w.load_queries(QueryColumns(q["id"], q["lon"], q["lat"], q["keywords"], q["k"]), initial, {})
    start = n_initial
    for b, size in enumerate(batches):
        batch = _objects(rng, size, start, prefix)
        start += size
        w.process_batch(b, batch.column("id").to_pylist(), batch.column("lon").to_numpy(),
                        batch.column("lat").to_numpy(), batch.column("t").to_numpy(),
                        batch.column("keywords").to_pylist())
        seen = pa.concat_tables([seen, batch]) if seen.num_rows else batch
        oracle = BruteForceKnn(seen)
        for i in range(nq):
            want = oracle.knn(q["lon"][i], q["lat"][i], q["keywords"][i], int(q["k"][i]))
            got = w.result(q["id"][i])
            assert [o for o, _ in got] == [o for o, _ in want], (b, q["id"][i])
            assert np.allclose([d for _, d in got], [d for _, d in want], rtol=1e-9)
