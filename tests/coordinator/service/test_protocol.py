"""The stream protocol: entries parse, or are rejected with one reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.coordinator.service.acks import REJECT_FIELD_BYTES, REJECT_FIELDS, reject_record
from knnmon.protocol import parse_object, parse_query_op
from knnmon.errors import REJECT_REASONS, Rejected
from knnmon.limits import Limits


@pytest.mark.parametrize("fields, reason", [
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "Coffee tea coffee"}, None),
    ({"id": "a", "lon": "1", "lat": "2", "text": "Great #Coffee!"}, None),
    ({"id": " ", "lon": "1", "lat": "2", "keywords": "x"}, "missing_id"),
    ({"id": "a", "lon": "nan", "lat": "2", "keywords": "x"}, "non_numeric_coordinates"),
    ({"id": "a", "lon": "181", "lat": "2", "keywords": "x"}, "longitude_out_of_range"),
    ({"id": "a", "lon": "1", "lat": "2", "text": "the and of"}, "no_keywords"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "x", "text": "y" * 70_000}, "field_too_large"),
    ({"id": "a b", "lon": "1", "lat": "2", "keywords": "x"}, "bad_id"),
    ({"id": "a\ud800", "lon": "1", "lat": "2", "keywords": "x"}, "not_utf8"),  # a lone surrogate (JSON's "\ud800")
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "caf\udce9"}, "not_utf8"),  # b"caf\xe9" read with surrogateescape
    ({"id": "a", "lon": "0", "lat": "0.0", "keywords": "x"}, "null_island"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "x", "t": "9" * 30}, "bad_time"),
    ({"id": "a", "lon": "1e999", "lat": "2", "keywords": "x"}, "non_numeric_coordinates"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": " ".join(f"w{i}" for i in range(33))}, "too_many_keywords"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "x", "t": "9000000000000000000"}, "future"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "x", "t": str(1700000000000 + 60_001)}, "future"),
    ({"id": "a", "lon": "1", "lat": "2", "keywords": "x", "t": "1"}, None),  # the past: bounded by a window
])
def test_object_entries_parse_or_are_rejected_with_a_reason(fields, reason):
    if reason is None:
        o = parse_object("1700000000000-0", fields)
        assert o.t == int(fields.get("t", 1700000000000)) and o.keywords in (("coffee", "tea"), ("coffee", "great"),
                                                                              ("x",))
    else:
        with pytest.raises(Rejected) as ex:
            parse_object("1700000000000-0", fields)
        assert ex.value.reason == reason


@pytest.mark.parametrize("fields, reason", [
    ({"op": "register", "id": "q", "lon": "1", "lat": "2", "keywords": "Coffee, TEA!", "k": "3"}, None),
    ({"op": "fly", "id": "q"}, "unknown_op"),
    ({"op": "register", "id": "q", "lon": "1", "lat": "2", "keywords": "coffee", "k": "0"}, "bad_k"),
    ({"op": "register", "id": "q", "lon": "1", "lat": "2", "keywords": "coffee", "k": "x"}, "bad_k"),
    ({"op": "register", "id": "q", "lat": "2", "keywords": "coffee", "k": "1"}, "missing_coordinates"),
    ({"op": "register", "id": "q", "lon": "1", "lat": "2", "keywords": "the of", "k": "1"}, "no_keywords"),
    ({"op": "unregister", "id": ""}, "missing_id"),
    ({"op": "register", "id": "q", "lon": "1", "lat": "2", "keywords": "coffee", "k": "9" * 20}, "k_too_large"),
    ({"op": "register", "id": "q", "lon": "0", "lat": "0", "keywords": "coffee", "k": "1"}, "null_island"),
    ({"op": "register", "id": "q\u0007", "lon": "1", "lat": "2", "keywords": "coffee", "k": "1"}, "bad_id"),
    ({"op": "register", "id": "{knn}q", "lon": "1", "lat": "2", "keywords": "coffee", "k": "1"}, "bad_id"),
    ({"op": "unregister", "id": "q}"}, "bad_id"),
    ({"op": "register", "id": "q\udcff", "lon": "1", "lat": "2", "keywords": "coffee", "k": "1"}, "not_utf8"),
])
def test_query_operations_parse_into_a_validated_query_or_are_rejected(fields, reason):
    if reason is None:
        op = parse_query_op(fields)
        assert op.op == "register" and op.query.keywords == ("coffee", "tea") and op.query.k == 3
        assert op.query.lon == 1.0 and op.query.lat == 2.0 and op.query.id == "q"
    else:
        with pytest.raises(Rejected) as ex:
            parse_query_op(fields)
        assert ex.value.reason == reason and reason in REJECT_REASONS


def test_future_bounds_t_by_the_entry_id_and_the_entry_id_by_redis_clock():
    base = {"id": "a", "lon": "1", "lat": "2", "keywords": "x"}
    eid = "1700000000000-0"
    assert parse_object(eid, {**base, "t": str(1700000000000 + 60_000)}).t == 1700000000000 + 60_000  # at the bound
    assert parse_object(eid, {**base, "t": "9000000000000000000"}, Limits(max_future_ms=None)).t == 9 * 10**18
    with pytest.raises(Rejected, match="ahead of its arrival") as ex:
        parse_object(eid, {**base, "t": str(1700000000000 + 1000)}, Limits(max_future_ms=999))
    assert ex.value.reason == "future" and "1700000000000" in ex.value.detail and "1700000001000" in ex.value.detail
    # An entry XADDed with an explicit id from the future, without t (it takes the id's time):
    far = "9999999999999-0"
    assert parse_object(far, base).t == 9999999999999  # without a clock, only t against the id is checked
    with pytest.raises(Rejected, match="ahead of Redis's clock") as ex:
        parse_object(far, base, clock_ms=1700000000000)
    assert ex.value.reason == "future"
    assert parse_object("1700000060000-0", base, clock_ms=1700000000000).t == 1700000060000  # at the bound


_NAME = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
_VALUE = st.one_of(st.text(max_size=3000), st.binary(max_size=3000))


@settings(max_examples=150, deadline=None)
@given(fields=st.dictionaries(st.one_of(_NAME, st.sampled_from(["_reason", "_entry", "_truncated"])), _VALUE,
                              max_size=40))
def test_a_reject_record_keeps_what_fits_and_is_bounded_whatever_was_sent(fields):
    rec = reject_record(fields, "field_too_large", "why " * 1000, "s:objects", "1-1")
    assert rec[b"_reason"] == b"field_too_large" and rec[b"_stream"] == b"s:objects" and rec[b"_entry"] == b"1-1"
    for k, v in rec.items():  # any client can read it: every name and value is UTF-8
        k.decode(), v.decode()
    own = {b"_reason", b"_detail", b"_stream", b"_entry", b"_truncated", b"_escaped", b"_fields_left_out"}
    kept = {k: v for k, v in rec.items() if k not in own}
    assert len(kept) <= REJECT_FIELDS
    assert all(len(k) <= REJECT_FIELD_BYTES and len(v) <= REJECT_FIELD_BYTES for k, v in rec.items()
               if k not in (b"_truncated", b"_escaped"))

    def as_text(x) -> tuple[bytes, int]:  # (what was sent as UTF-8, bad bytes as \xNN; its size as sent)
        b = x if isinstance(x, bytes) else x.encode("utf-8", "surrogateescape")
        return b.decode("utf-8", "backslashreplace").encode(), len(b)

    sent = {as_text(k)[0]: as_text(v) for k, v in fields.items()}
    cut, escaped = rec.get(b"_truncated", b""), rec.get(b"_escaped", b"")
    for k, (v, size) in sent.items():
        name = b"_" + k if k in own else k
        if name in kept and len(v) <= REJECT_FIELD_BYTES and len(k) <= REJECT_FIELD_BYTES:
            assert kept[name] == v  # what fits is kept as sent
        elif name in kept:  # cut at a character boundary, named with its size
            assert v.startswith(kept[name]) and len(v) - len(kept[name]) < 4 + len(v) - REJECT_FIELD_BYTES
            assert str(size).encode() in cut
        if name in kept and len(v) != size:  # escaped, named with its size as sent
            assert str(size).encode() in escaped
    assert len(kept) + int(rec.get(b"_fields_left_out", b"0")) == len(sent)


def test_an_entry_time_past_64_bits_is_a_bad_time_even_without_a_future_bound():
    """A client may XADD with an explicit id up to 2**64 - 1 ms; an object taking that time would
    not fit the service's int64 times (found by the bulk parser's property test)."""
    fields = {"id": "a", "lon": "1", "lat": "2", "keywords": "x"}
    with pytest.raises(Rejected) as ex:
        parse_object(f"{2**64 - 1}-0", fields, Limits(max_future_ms=None))
    assert ex.value.reason == "bad_time"
    assert parse_object(f"{2**63 - 1}-0", fields, Limits(max_future_ms=None)).t == 2**63 - 1
