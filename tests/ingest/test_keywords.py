"""Keyword normalisation: each documented rule, the stop-word list, and invariants (hypothesis)."""

from __future__ import annotations

import glob
import os
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.keywords import STOPWORDS_RESOURCE, normalize_keywords, stop_words


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Coffee COFFEE coffee", ["coffee"]),                          # lower-case, unique
        ("#Coffee #nyc", ["coffee", "nyc"]),                           # hashtags kept as words
        ("#nyc2022 nyc2022", ["nyc"]),                                 # rule 8: hashtag read as plain text
        ("#AAA0", ["aaa"]),                                            # hypothesis: was not a fixed point
        ("0ꛦ", []),                                                     # hypothesis: Nl is no letter
        ("@bob_smith hello", ["hello"]),                               # handles stripped
        ("see https://t.co/AbC and www.x.com now", ["see"]),          # URLs dropped; "now" is a stop word
        ("the cat and a dog", ["cat", "dog"]),                         # stop words
        ("don’t you’ve", []),                                          # curly apostrophes, stop words
        ("O'Reilly's", ["oreillys"]),                                  # apostrophes deleted
        ("auto-repair Food & Drink", ["auto", "drink", "food", "repair"]),  # split at punctuation
        ("123 4th 7 x 🥰 ...", ["4th"]),                               # numbers, 1-letter, emoji go
        ("Café", ["café"]),                                            # letters beyond ASCII kept
        ("sooooo goooood", ["goood", "sooo"]),                          # TweetTokenizer's reduce_len
    ],
)
def test_rules(text, expected):
    assert normalize_keywords(text) == sorted(expected)


def test_stemming_is_optional():
    assert normalize_keywords("running shoes") == ["running", "shoes"]
    assert normalize_keywords("running shoes", stem=True) == ["run", "shoe"]


def test_iterables_and_none():
    assert normalize_keywords(None) == []
    assert normalize_keywords([None, "", "Retail", "Auto Repair"]) == ["auto", "repair", "retail"]


def test_query_and_object_meet():
    """A query for "Coffee" matches a place tagged "coffee shop" and a tweet with "#coffee"."""
    q = set(normalize_keywords("Coffee"))
    assert q & set(normalize_keywords(["Food & Drink", "Coffee Shop"]))
    assert q & set(normalize_keywords("best #coffee in town"))


def test_stop_words_equal_the_jar_copy():
    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-mllib_*.jar"))
    if not jars:
        pytest.skip("pyspark has no mllib jar here")
    with zipfile.ZipFile(jars[0]) as zf:
        jar_words = frozenset(zf.read(STOPWORDS_RESOURCE).decode("utf-8").split())
    assert stop_words() == jar_words
    assert len(stop_words()) == 181 and {"the", "don't", "and"} <= stop_words()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=5))
def test_invariants(texts):
    out = normalize_keywords(texts)
    assert out == sorted(set(out))
    for w in out:
        assert len(w) >= 2 and w == w.lower() and w not in stop_words()
        assert any(c.isalpha() for c in w) and all(c.isalnum() for c in w)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_keywords_are_fixed_points(text):
    """Keywords fed back in (as a client registering a query would) come out unchanged."""
    out = normalize_keywords(text)
    assert normalize_keywords(" ".join(out)) == out
    assert normalize_keywords(out) == out
