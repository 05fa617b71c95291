"""The validated query: one set of rules for the API, the stream protocol and registration."""

from __future__ import annotations

import pytest

from knnmon.errors import REJECT_REASONS, InvalidQueryError
from knnmon.query import Query, QueryColumns


def test_create_normalises_keywords_and_compares_by_value():
    q = Query.create(" q1 ", "-71.41", 41.82, "Coffee, TEA and coffee!", "5")
    assert q == Query("q1", -71.41, 41.82, ("coffee", "tea"), 5)
    assert Query.create("q1", -71.41, 41.82, ["tea", "coffee"], 5) == q  # a list of terms, same query
    cols = QueryColumns.of([q, Query.create("q2", 0, 0, "bar", 1)])
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
])
def test_invalid_parameters_are_rejected_with_a_reason(args, reason):
    with pytest.raises(InvalidQueryError, match=reason) as ex:
        Query.create(*args)
    assert ex.value.reason == reason in REJECT_REASONS
