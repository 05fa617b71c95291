"""Query workloads drawn from the data, as the paper draws them (Tsuruoka et al. 2019, §5).

Each query takes the location of a random object and 1 to 3 of that object's keywords; ``k``
is uniform in ``[1, k_max]``. Objects are drawn **without replacement**, so query locations are
distinct objects and ``n`` may not exceed the number of objects.

This runs on pyarrow and numpy, not Spark: a seed must give the same workload whatever the
Spark partitioning, and 1 M queries take seconds in one process. The objects are put in ``id``
order first, so the result depends only on the set of objects, the parameters and the seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from knnmon.errors import InvalidArgumentError

__all__ = ["QueryWorkload", "generate_queries", "write_queries", "QUERY_SCHEMA"]

#: Schema of a query file.
QUERY_SCHEMA = pa.schema([
    ("id", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()),
    ("keywords", pa.list_(pa.string())), ("k", pa.int32()),
])


@dataclass(frozen=True)
class QueryWorkload:
    """Parameters of a generated workload (checked on construction).

    Attributes
    ----------
    n : int
        Number of queries, ``>= 1``.
    k_max : int
        ``k`` of each query is uniform in ``[1, k_max]``; ``k_max >= 1``.
    seed : int
        Seed of numpy's ``default_rng``.
    max_keywords : int
        Each query takes ``1..max_keywords`` keywords of its object (paper: 3).
    """

    n: int
    k_max: int
    seed: int = 0
    max_keywords: int = 3

    def __post_init__(self) -> None:
        if self.n < 1:
            raise InvalidArgumentError(f"--n (number of queries) must be >= 1; got {self.n}")
        if self.k_max < 1:
            raise InvalidArgumentError(f"--kmax must be >= 1; got {self.k_max}")
        if self.max_keywords < 1:
            raise InvalidArgumentError(f"max_keywords must be >= 1; got {self.max_keywords}")


def generate_queries(objects: pa.Table, workload: QueryWorkload) -> pa.Table:
    """Draw a query workload from objects.

    Parameters
    ----------
    objects
        Columns ``id`` (string), ``lon``, ``lat`` (float64 degrees), ``keywords``
        (list<string>, non-empty), e.g. from :func:`read_objects`.
    workload
        Size, ``k_max``, seed.

    Returns
    -------
    pyarrow.Table
        :data:`QUERY_SCHEMA`: ``id`` ``"q0"``, ``"q1"``, ...; ``lon``/``lat`` of the drawn
        object; ``keywords`` 1..3 distinct keywords of it, sorted; ``k`` int32 in
        ``[1, k_max]``.

    Raises
    ------
    InvalidArgumentError
        If ``workload.n`` exceeds the number of objects.
    """
    m = objects.num_rows
    if workload.n > m:
        raise InvalidArgumentError(f"cannot seed {workload.n} queries from {m} objects (one object per query)")
    objects = objects.take(pc.sort_indices(objects, sort_keys=[("id", "ascending")]))
    rng = np.random.default_rng(workload.seed)
    picked = rng.choice(m, size=workload.n, replace=False)
    kw = objects.column("keywords").combine_chunks()
    offsets = kw.offsets.to_numpy()
    values = kw.values
    starts = offsets[picked]
    lens = offsets[picked + 1] - starts
    if (lens < 1).any():
        raise InvalidArgumentError("objects must have at least one keyword each (ingest guarantees it)")
    n_kw = np.minimum(rng.integers(1, workload.max_keywords + 1, size=workload.n), lens)
    # Choose n_kw distinct keywords per query: rank each candidate keyword by a random key
    # within its query and keep the n_kw smallest.
    owner = np.repeat(np.arange(workload.n), lens)
    flat = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
    order = np.lexsort((rng.random(flat.size), owner))
    rank = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
    chosen = flat[order][rank < np.repeat(n_kw, lens)]
    chosen_owner = owner[order][rank < np.repeat(n_kw, lens)]
    # Sort the keywords of each query alphabetically.
    words = values.take(pa.array(chosen))
    word_rank = pc.rank(words, sort_keys="ascending", tiebreaker="first").to_numpy()
    chosen = chosen[np.lexsort((word_rank, chosen_owner))]
    q_offsets = np.concatenate([[0], np.cumsum(n_kw)]).astype(np.int32)
    keywords = pa.ListArray.from_arrays(pa.array(q_offsets), values.take(pa.array(chosen)))
    k = rng.integers(1, workload.k_max + 1, size=workload.n).astype(np.int32)
    ids = pa.array([f"q{i}" for i in range(workload.n)], type=pa.string())
    return pa.Table.from_arrays(
        [ids, objects.column("lon").take(picked), objects.column("lat").take(picked), keywords, pa.array(k)],
        schema=QUERY_SCHEMA,
    )


def write_queries(queries: pa.Table, path: str) -> None:
    """Write a query table to one Parquet file (parent directories are created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(queries.cast(QUERY_SCHEMA), path)
