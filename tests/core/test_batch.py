"""What travels between coordinator, workers and writer: a batch's changes from per-query diffs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from knnmon.batch import BatchChanges, ObjectBatch, ObjectColumns, ObjectInfo
from knnmon.feed import parse_entry
from knnmon.reports import WorkerReport, WriteFigures

OBJ = {f"o{i}": ObjectInfo(-71.0, 41.0 + i, 1_000 + i, ["coffee"]) for i in range(4)}


def test_from_diffs_flattens_per_query_and_feeds_one_line_each():
    c = BatchChanges.from_diffs([("q1", [("o1", 5.0), ("o2", 7.5)], ["o0"]),
                                 ("q2", [("o0", 2.0)], ["o2", "o3"])], OBJ, 3)
    assert list(c.qids) == ["q1", "q2"] and c.version == 3 and len(c) == 2
    assert (list(c.n_entered), list(c.entered), list(c.distances)) == ([2, 1], ["o1", "o2", "o0"], [5.0, 7.5, 2.0])
    assert (list(c.n_left), list(c.left)) == ([1, 2], ["o0", "o2", "o3"])
    assert set(c.objects) == {"o0", "o1", "o2"}  # the details of every object that entered
    assert c.feed_text() == "q1\to1 o2\to0\nq2\to0\to2 o3"
    assert parse_entry({"version": "3", "changes": c.feed_text()}) == [("q1", ["o1", "o2"], ["o0"], 3),
                                                                      ("q2", ["o0"], ["o2", "o3"], 3)]


def test_a_queued_write_joins_the_report():
    r = WorkerReport(worker=1, batch=7, changed=3, cpu_s=0.010, write_queued=True)
    done = r.with_write(WriteFigures(redis_s=0.004, redis_server_s=0.003, writer_cpu_s=0.001))
    assert done.redis_server_s == 0.003 and abs(done.cpu_s - 0.014) < 1e-12 and r.cpu_s == 0.010


def test_object_details_round_trip_as_text():
    o = ObjectInfo(-71.4128343, 41.8239891, 1_700_000_000_123, ["coffee", "shop"])
    assert ObjectInfo.from_text(o.to_text()) == o
    assert ObjectInfo.from_text(ObjectInfo(1.0, 2.0, 3, []).to_text()) == ObjectInfo(1.0, 2.0, 3, [])
    with pytest.raises(ValueError):
        ObjectInfo.from_text("1.0 2.0")


_WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-#", min_size=1, max_size=8)
_INFO = st.builds(ObjectInfo, st.floats(-180, 180), st.floats(-90, 90), st.integers(-2**62, 2**62),
                  st.lists(_WORD, max_size=4))


@settings(deadline=None)  # (the first call imports pyarrow.compute)
@given(st.dictionaries(st.text("abcxyz_0123", min_size=1, max_size=6), _INFO, max_size=20))
def test_object_columns_parse_details_texts_as_from_text_does(infos):
    """A revival's details, read as texts and parsed in bulk (Arrow), equal each text parsed
    alone (:meth:`ObjectInfo.from_text`); their texts again are the same values."""
    oids = list(infos)
    texts = [infos[o].to_text() for o in oids]
    cols = ObjectColumns.of_texts(oids, texts)
    assert list(cols) == oids
    assert all(cols[o] == ObjectInfo.from_text(x) for o, x in zip(oids, texts))
    assert [ObjectInfo.from_text(x) for x in cols.texts(oids)] == [infos[o] for o in oids]
    assert cols.times(oids + ["none"], -1).tolist() == [infos[o].t for o in oids] + [-1]
    # every object's, by row (a worker's refill reads them so): the same as asked by id
    assert cols.texts() == cols.texts(oids) and list(cols.ids) == oids
    assert cols.t.tolist() == [infos[o].t for o in oids]
    listed = ObjectColumns(oids, [infos[o].lon for o in oids], [infos[o].lat for o in oids],
                           [infos[o].t for o in oids], [infos[o].keywords for o in oids])
    assert listed.texts() == listed.texts(oids)


@pytest.mark.parametrize("text", ["1.0 2.0", "x 2.0 3", "1.0 2.0 3.5 kw", ""])
def test_object_columns_reject_a_text_that_is_not_details(text):
    with pytest.raises(ValueError):
        ObjectColumns.of_texts(["o", "p"], ["1.0 2.0 3 ok", text])


@settings(max_examples=50, deadline=None)
@given(masks=st.lists(st.integers(0, 2**64 - 1), max_size=30), worker=st.integers(0, 63))
def test_a_worker_takes_the_rows_with_its_bit(masks, worker):
    """``ObjectBatch.rows_of``: a worker called without rows takes those its bitmasks give it."""
    m = np.array(masks, dtype=np.uint64)
    batch = ObjectBatch(3, None, np.empty(0, np.int64), np.empty(0, np.int64), m)
    assert batch.rows_of(worker).tolist() == [i for i, x in enumerate(masks) if x >> worker & 1]
    with pytest.raises(ValueError, match="no worker bitmasks"):
        ObjectBatch(3, None, np.empty(0, np.int64), np.empty(0, np.int64)).rows_of(worker)


def test_a_batch_travels_with_its_table_as_one_ipc_stream():
    """Pickled (as ``ray.put`` does): the same table, pairs and masks come back."""
    import pickle

    import pyarrow as pa

    t = pa.table({"id": ["a", "b"], "lon": [1.0, 2.0], "lat": [3.0, 4.0], "t": [1, 2], "keywords": [["x"], ["y", "z"]]})
    b = ObjectBatch(3, t, np.array([0, 1, 1]), np.array([5, 6, 7]), np.array([1, 2], dtype=np.uint64))
    c = pickle.loads(pickle.dumps(b, protocol=5))
    assert c.table.equals(t) and c.number == 3 and c.rows_of(1).tolist() == [1]
    assert c.pair_obj.tolist() == [0, 1, 1] and c.pair_code.tolist() == [5, 6, 7]
