"""Parsing many object entries at once gives each exactly what parsing it alone gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.bulk_parse import parse_objects
from knnmon.errors import Rejected
from knnmon.limits import INT64_MAX, INT64_MIN, MAX_FIELD_BYTES, Limits
from knnmon.protocol import parse_object

ARRIVAL = 1_700_000_000_000
_COORD = st.one_of(st.floats(-200, 200).map(repr), st.sampled_from(["0", "0.0", "-0", "nan", "inf", "1e999", "", " 12 ",
                                                                    "1_5", "abc", "180", "-90.0", "90.0001"]),
                   st.text(max_size=8))
_ID = st.one_of(st.from_regex(r"[a-z0-9:_-]{1,12}", fullmatch=True),
                st.sampled_from(["", " ", "a b", " a", "a\t", "a\x00", "a\ud800", "é", "x" * 256, "x" * 257, "{q}"]),
                st.text(max_size=12))
_TIME = st.one_of(st.integers(ARRIVAL - 10**9, ARRIVAL + 120_000).map(str),
                  st.sampled_from(["", "1.5", " 7 ", str(INT64_MAX), str(INT64_MAX + 1), str(INT64_MIN), "9" * 30,
                                   "-1", "abc"]))
_WORDS = st.one_of(st.lists(st.sampled_from(["Coffee", "tea", "x", "ß", "caf\udce9", "  "]), max_size=4).map(" ".join),
                   st.just(" ".join(f"w{i}" for i in range(40))))
_ENTRY_ID = st.one_of(st.integers(ARRIVAL - 10**6, ARRIVAL + 200_000).map(lambda ms: f"{ms}-0"),
                      st.sampled_from([f"{2**64 - 1}-0", "0-1"]))


@st.composite
def entries(draw):
    fields = {}
    for name, values in (("id", _ID), ("lon", _COORD), ("lat", _COORD), ("t", _TIME), ("keywords", _WORDS),
                         ("text", st.sampled_from(["Great #Coffee!", "the and of"])),
                         ("extra", st.sampled_from(["x", "y" * (MAX_FIELD_BYTES + 1), "\udcff"]))):
        if draw(st.booleans()) if name in ("t", "text", "extra") else draw(st.integers(0, 9)) > 0:
            fields[name] = draw(values)
    return draw(_ENTRY_ID), fields


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(entries(), max_size=30), bound=st.sampled_from([None, 60_000, 0]),
       clock=st.sampled_from([None, ARRIVAL, ARRIVAL + 5_000]))
def test_many_entries_parse_as_each_alone(batch, bound, clock):
    limits = Limits(max_future_ms=bound, max_keywords=32)
    got = parse_objects(batch, limits, clock_ms=clock)
    for i, (eid, fields) in enumerate(batch):
        try:
            want = parse_object(eid, fields, limits, clock_ms=clock)
        except Rejected as r:
            assert not got.ok[i] and got.rejects[i].reason == r.reason and got.rejects[i].detail == r.detail
            continue
        assert got.ok[i] and i not in got.rejects
        assert (got.ids[i], float(got.lon[i]), float(got.lat[i]), int(got.t[i]), got.keywords[i]) == \
            (want.id, want.lon, want.lat, want.t, want.keywords)
    rows = np.flatnonzero(got.ok)[::-1]  # (any rows, in any order)
    assert got.table(rows).to_pylist() == [{"id": got.ids[i], "lon": got.lon[i], "lat": got.lat[i], "t": got.t[i],
                                            "keywords": list(got.keywords[i])} for i in rows.tolist()]


def test_plain_entries_take_the_columns_and_the_rest_their_reason():
    batch = [(f"{ARRIVAL + i}-0", {"id": f"o{i}", "lon": str(-71 + i / 10), "lat": "42.5",
                                   "keywords": "Tea coffee tea"}) for i in range(1000)]
    batch[7] = (batch[7][0], {"id": "o7", "lon": "0", "lat": "0", "keywords": "x"})
    batch[9] = (batch[9][0], {"id": "o9", "lon": "1", "lat": "2", "text": "Great #Coffee!"})
    got = parse_objects(batch)
    assert got.ok.sum() == 999 and set(got.rejects) == {7} and got.rejects[7].reason == "null_island"
    assert got.keywords[0] == ("coffee", "tea") and got.keywords[9] == ("coffee", "great")
    assert np.array_equal(got.t[:3], [ARRIVAL, ARRIVAL + 1, ARRIVAL + 2]) and got.ids[999] == "o999"


def test_a_reject_holds_no_traceback_that_would_keep_its_batch_alive():
    """A raised reject's traceback (or its context's: a UnicodeEncodeError) holds the parsing
    frame and the whole batch in a cycle; recovery builds without the collector, so it would
    hold every chunk of the stream until the end (docs/window.md)."""
    batch = [("1700000000000-0", {"id": "a\ud800", "lon": "1", "lat": "2", "keywords": "x"}),
             ("1700000000000-1", {"id": "b", "lon": "x", "lat": "2", "keywords": "x"})]
    got = parse_objects(batch)
    assert [r.reason for r in got.rejects.values()] == ["not_utf8", "non_numeric_coordinates"]
    assert all(r.__traceback__ is None and r.__context__ is None for r in got.rejects.values())


def test_a_reject_survives_pickling_with_its_reason_and_detail():
    """Recovery reads the objects stream in a child process: its rejects come back pickled."""
    import pickle

    from knnmon.errors import Rejected

    r = pickle.loads(pickle.dumps(Rejected("late", "t=1 <= 2")))
    assert (type(r), r.reason, r.detail, str(r)) == (Rejected, "late", "t=1 <= 2", "late: t=1 <= 2")
    assert pickle.loads(pickle.dumps(Rejected("null_island"))).detail == ""
