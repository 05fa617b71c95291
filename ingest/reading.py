"""The read side of ingest outputs: objects in stream order, and query files, checked.

Later stages (planning, the runtime, the service, benchmarks) read what ``knnmon ingest`` and
``knnmon queries generate`` wrote only through these functions.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from knnmon.errors import InputPathError, InvalidArgumentError
from knnmon.limits import DEFAULT_LIMITS, Limits

#: The files of an ingest's output directory (written by :mod:`knnmon.ingest.output`).
OBJECTS = "objects.parquet"
STATS = "stats.parquet"
REJECTS = "rejects"
MANIFEST = "manifest.json"

__all__ = ["MANIFEST", "OBJECTS", "OBJECT_COLUMNS", "REJECTS", "STATS", "initial_objects", "load_queries",
           "read_objects", "stream_head", "stream_order"]

#: The columns of a streamed object (``objects.parquet``).
OBJECT_COLUMNS = ["id", "lon", "lat", "t", "keywords"]


def read_objects(objects_dir: str, columns: list[str] | None = None) -> pa.Table:
    """Read ``objects_dir/objects.parquet`` (an ingest output) as a pyarrow Table.

    Raises
    ------
    InputPathError
        If ``objects_dir`` has no ``objects.parquet``.
    """
    path = os.path.join(objects_dir, OBJECTS)
    if not os.path.exists(path):
        raise InputPathError(f"no {OBJECTS} in {objects_dir}: run `knnmon ingest ... --out {objects_dir}` first")
    return pq.read_table(path, columns=columns)


def stream_order(objects: pa.Table, shuffle: int | None = None) -> pa.Table:
    """Objects in stream order ``(t, id)``, or shuffled with seed ``shuffle``.

    Ingest writes ``objects.parquet`` in ``(t, id)`` order already; that is checked (one pass)
    and the sort skipped then.
    """
    if shuffle is not None:
        return objects.take(pa.array(np.random.default_rng(shuffle).permutation(objects.num_rows)))
    t = objects.column("t").to_numpy()
    ordered = bool(np.all(np.diff(t) >= 0))
    tie = np.flatnonzero(np.diff(t) == 0) if ordered else np.empty(0, dtype=np.int64)
    if len(tie):
        ids = objects.column("id")
        ordered = bool(pc.all(pc.less(ids.take(pa.array(tie)), ids.take(pa.array(tie + 1)))).as_py())
    if ordered:
        return objects
    return objects.take(pc.sort_indices(objects, sort_keys=[("t", "ascending"), ("id", "ascending")]))


def stream_head(objects_dir: str, n: int, columns: list[str] | None = None) -> pa.Table:
    """The first ``n`` objects in stream order ``(t, id)`` (all if fewer), reading only those rows
    when the file is in ``t`` order (as ingest writes it).

    The whole ``t`` column is read (8 bytes per object) to check the order; then only the file's
    first rows up to the end of the run of ``t`` equal to the ``n``-th one, sorted by
    :func:`stream_order`, so the ``n`` kept are exactly those a full read and sort would keep.
    A file not in ``t`` order is read whole. A bounded run over 20 M objects keeps the ~1 M it
    uses in memory instead of all of them.

    Raises
    ------
    InputPathError
        If ``objects_dir`` has no ``objects.parquet``.
    InvalidArgumentError
        ``n < 0``.
    """
    if n < 0:
        raise InvalidArgumentError(f"the number of objects must be >= 0; got {n}")
    path = os.path.join(objects_dir, OBJECTS)
    if not os.path.exists(path):
        raise InputPathError(f"no {OBJECTS} in {objects_dir}: run `knnmon ingest ... --out {objects_dir}` first")
    t = pq.read_table(path, columns=["t"]).column("t").to_numpy()
    cols = None if columns is None else list(dict.fromkeys([*columns, "t", "id"]))  # the order's keys
    if n >= len(t) or not bool(np.all(np.diff(t) >= 0)):
        head = stream_order(read_objects(objects_dir, cols), None).slice(0, n)
    else:
        end = int(np.searchsorted(t, t[n - 1], side="right")) if n else 0
        head = stream_order(ds.dataset(path, format="parquet").head(end, columns=cols), None).slice(0, n)
    return head if columns is None else head.select(columns)


def initial_objects(objects_dir: str, n: int) -> pa.Table:
    """The first ``n`` objects in stream order ``(t, id)`` (all if fewer), with ``id``, ``lon``,
    ``lat``, ``keywords``.

    Raises
    ------
    InvalidArgumentError
        ``n < 0``.
    """
    if n < 0:
        raise InvalidArgumentError(f"--initial must be >= 0; got {n}")
    return stream_head(objects_dir, n, ["id", "lon", "lat", "keywords"])


def load_queries(path: str, limits: Limits = DEFAULT_LIMITS) -> pa.Table:
    """Read a query file (``id``, ``lon``, ``lat``, ``keywords``, ``k``) and check it, all rows at
    once (the file's entry point of :class:`knnmon.query.Query`'s rules; keywords are taken as
    normalised, as ``knnmon queries generate`` writes them).

    Raises
    ------
    InputPathError
        The file does not exist or is not Parquet.
    InvalidArgumentError
        No queries, missing columns, duplicate ids, ``k`` outside ``[1, limits.max_k]``, no
        keyword or more than ``limits.max_keywords``, coordinates out of range or (0, 0); the
        message gives the count and the first offending ids.
    """
    if not os.path.exists(path):
        raise InputPathError(f"query file does not exist: {path}")
    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowException) as ex:
        raise InputPathError(f"cannot read query file {path}: {ex}") from ex
    missing = {"id", "lon", "lat", "keywords", "k"} - set(t.column_names)
    if missing:
        raise InvalidArgumentError(f"{path}: query file lacks column(s) {sorted(missing)}")
    if t.num_rows == 0:
        raise InvalidArgumentError(f"{path}: the query file holds no queries")
    t = t.select(["id", "lon", "lat", "keywords", "k"])
    lon, lat, k = (t.column(c).to_numpy(zero_copy_only=False) for c in ("lon", "lat", "k"))
    n_kw = pc.list_value_length(t.column("keywords")).fill_null(0).to_numpy(zero_copy_only=False)
    ids = t.column("id")
    problems = {
        "k < 1": k < 1,
        f"k above limits.max_k {limits.max_k}": k > limits.max_k,
        "no keyword": n_kw < 1,
        f"more than limits.max_keywords {limits.max_keywords} keywords": n_kw > limits.max_keywords,
        "longitude outside [-180, 180] or not finite": ~(np.abs(lon) <= 180),
        "latitude outside [-90, 90] or not finite": ~(np.abs(lat) <= 90),
        "coordinates (0, 0) (null island)": (lon == 0) & (lat == 0),
    }
    for what, bad in problems.items():
        if bad.any():
            first = ids.filter(pa.array(bad)).slice(0, 5).to_pylist()
            raise InvalidArgumentError(f"{path}: {int(bad.sum())} invalid queries ({what}), e.g. {first}")
    if pc.count_distinct(ids).as_py() != t.num_rows:
        raise InvalidArgumentError(f"{path}: query ids are not unique")
    return t
