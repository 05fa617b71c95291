"""Reading ingest outputs: the first objects of a stream without reading the rest."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.errors import InvalidArgumentError
from knnmon.ingest.reading import OBJECT_COLUMNS, read_objects, stream_head, stream_order


KNN_COLUMNS = ["id", "lon", "lat", "keywords"]  # what the initial kNN reads: no "t"


def _full_head(objects_dir, n, columns=OBJECT_COLUMNS):
    return stream_order(read_objects(objects_dir, OBJECT_COLUMNS), None).slice(0, n).select(columns)


def test_stream_head_equals_a_full_read_and_sort_on_real_places(places_slice):
    t = read_objects(str(places_slice), ["t"]).column("t").to_numpy()
    ties = np.flatnonzero(np.diff(t) == 0) + 1  # n cutting a run of equal t
    assert len(ties), "the slice should have objects with equal t (the tie-break by id is tested)"
    for n in (0, 1, 2_500, int(ties[len(ties) // 2]), len(t) - 1, len(t), len(t) + 10):
        for columns in (OBJECT_COLUMNS, KNN_COLUMNS):
            got = stream_head(str(places_slice), n, columns)
            assert got.equals(_full_head(str(places_slice), n, columns)), (n, columns)


def test_stream_head_of_a_file_out_of_t_order_reads_it_whole(places_slice, tmp_path):
    table = read_objects(str(places_slice))
    shuffled = table.take(pa.array(np.random.default_rng(0).permutation(table.num_rows)))
    os.makedirs(tmp_path / "objects.parquet")
    pq.write_table(shuffled, tmp_path / "objects.parquet" / "part-0.parquet")
    for n in (1, 777, table.num_rows):
        for columns in (OBJECT_COLUMNS, KNN_COLUMNS):
            got = stream_head(str(tmp_path), n, columns)
            assert got.equals(_full_head(str(places_slice), n, columns)), (n, columns)


def test_stream_head_rejects_a_negative_count(places_slice):
    with pytest.raises(InvalidArgumentError):
        stream_head(str(places_slice), -1)
