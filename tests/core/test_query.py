"""The validated query: one set of rules for the API, the stream protocol and registration."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.errors import REJECT_REASONS, InvalidArgumentError, InvalidQueryError
from knnmon.limits import Limits
from knnmon.query import Query, QueryColumns


def test_create_normalises_keywords_and_compares_by_value():
    q = Query.create(" q1 ", "-71.41", 41.82, "Coffee, TEA and coffee!", "5")
    assert q == Query("q1", -71.41, 41.82, ("coffee", "tea"), 5)
    assert Query.create("q1", -71.41, 41.82, ["tea", "coffee"], 5) == q  # a list of terms, same query
    cols = QueryColumns.of([q, Query.create("q2", 1, 1, "bar", 1)])
    assert len(cols) == 2 and cols.ids == ["q1", "q2"] and cols.keywords == [("coffee", "tea"), ("bar",)]


@pytest.mark.parametrize("args, reason", [
    (("", 1, 2, "coffee", 1), "missing_id"),
    (("q", "east", 2, "coffee", 1), "non_numeric_coordinates"),
    (("q", float("inf"), 2, "coffee", 1), "non_numeric_coordinates"),
    (("q", 180.5, 2, "coffee", 1), "longitude_out_of_range"),
    (("q", 1, -90.5, "coffee", 1), "latitude_out_of_range"),
    (("q", 1, 2, "coffee", 0), "bad_k"),
    (("q", 1, 2, "coffee", "three"), "bad_k"),
    (("q", 1, 2, "the of and", 3), "no_keywords"),
    (("q", 1, 2, None, 3), "no_keywords"),
    (("q x", 1, 2, "coffee", 1), "bad_id"),
    (("q" * 257, 1, 2, "coffee", 1), "bad_id"),
    (("q", 0, 0, "coffee", 1), "null_island"),
    (("q", 1, 2, "coffee", "99999999999999999999"), "k_too_large"),
    (("q", 1, 2, "coffee", 1001), "k_too_large"),
    (("q", 1, 2, "coffee", 2.5), "bad_k"),
    (("q", 1, 2, " ".join(f"word{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(33)), 1), "too_many_keywords"),
])
def test_invalid_parameters_are_rejected_with_a_reason(args, reason):
    with pytest.raises(InvalidQueryError, match=reason) as ex:
        Query.create(*args)
    assert ex.value.reason == reason in REJECT_REASONS


def test_limits_are_the_deployments_to_set():
    tight = Limits(max_k=5, max_keywords=2)
    assert Query.create("q", 1, 2, "coffee tea", 5, limits=tight).k == 5
    with pytest.raises(InvalidQueryError, match="k_too_large"):
        Query.create("q", 1, 2, "coffee", 6, limits=tight)
    with pytest.raises(InvalidQueryError, match="too_many_keywords"):
        Query.create("q", 1, 2, "coffee tea cake", 1, limits=tight)
    with pytest.raises(InvalidArgumentError, match="limits.max_k must be >= 1"):
        Limits(max_k=0)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_an_id_is_refused_for_any_whitespace_or_unprintable_character_in_it(text):
    """``parse_id`` checks the whole id at once; the rule is still every character's: after the
    outer blanks are stripped, no whitespace, control character or lone surrogate inside."""
    from knnmon.errors import Rejected
    from knnmon.limits import parse_id

    inner = text.strip()
    bad = not inner or any(c.isspace() or not c.isprintable() for c in inner) or len(inner.encode(
        errors="surrogatepass")) > 256
    try:
        assert parse_id(text) == inner and not bad
    except Rejected as ex:
        assert bad and ex.reason in ("missing_id", "bad_id")
