"""Keyword normalisation: the one function that turns text into keywords, for objects and queries.

Every keyword in knnmon -- of a place, a tweet, a generated query, a query a user registers --
comes out of :func:`normalize_keywords`, so a query for ``"Coffee"`` matches a place tagged
``"coffee shop"`` and a tweet saying ``"#coffee"``.

The rules, in order, applied to each input text:

1. Unicode NFKC; typographic apostrophes (U+2018, U+2019, U+02BC) become ``'``.
2. Tokenise with nltk's :class:`~nltk.tokenize.TweetTokenizer` (lower-cased, ``@handles``
   stripped, runs of 3+ repeated characters shortened to 3). The tokenizer keeps the case of
   what it takes for emoticons (``8P``), so every token is lower-cased again.
3. Drop URL tokens (``http://``, ``https://``, ``www.``, or any token containing ``://``).
4. Strip leading ``#`` (hashtags are kept as words: ``#Coffee`` -> ``coffee``).
5. Drop tokens that are English stop words (NLTK's list of 181 words, as shipped in pyspark's
   mllib jar; it holds forms such as ``don't``).
6. Delete apostrophes (``o'reilly's`` -> ``oreillys``); split the rest at every character that
   is neither a letter nor a digit (``auto-repair`` -> ``auto``, ``repair``; ``Food & Drink`` ->
   ``food``, ``drink``).
7. Keep a piece only if it has at least 2 characters, at least one letter (``str.isalpha``),
   and is not a stop word (so numbers, emoji and punctuation go); lower-case it.
8. Normalise each piece again by rules 1-7 until it maps to itself. The tokenizer splits
   ``covid19`` into ``covid`` and ``19`` but keeps ``#covid19`` whole; with this rule both give
   ``covid``. Every keyword is then a fixed point: ``normalize_keywords(kw) == [kw]``, so a query
   registered with an object's keyword matches that object.
9. Optionally stem with the Snowball (Porter2) English stemmer (``stem=True``).
10. The result is sorted and unique.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from importlib import resources

__all__ = ["normalize_keywords", "stop_words", "STOPWORDS_RESOURCE"]

#: Where NLTK's English stop-word list sits inside pyspark's ``spark-mllib`` jar.
STOPWORDS_RESOURCE = "org/apache/spark/ml/feature/stopwords/english.txt"

_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'"})
_URL = re.compile(r"^(?:https?://|www\.)|://")
_NON_ALNUM = re.compile(r"[^\w]|_")
_MAX_DEPTH = 4


@functools.cache
def stop_words() -> frozenset[str]:
    """Return NLTK's English stop-word list (181 lower-case words).

    The list ships with knnmon (``knnmon/data/stopwords_english.txt``), copied from the copy of
    NLTK's list inside pyspark's ``spark-mllib`` jar (:data:`STOPWORDS_RESOURCE`); a test checks
    that the two are equal. Shipping it means no ``nltk.download`` (no network) and no jar on
    Spark executors or Ray workers.
    """
    text = resources.files("knnmon").joinpath("data", "stopwords_english.txt").read_text("utf-8")
    return frozenset(w.strip().lower() for w in text.split() if w.strip())


@functools.cache
def _tokenizer():
    from nltk.tokenize import TweetTokenizer

    return TweetTokenizer(preserve_case=False, strip_handles=True, reduce_len=True)


@functools.cache
def _stemmer():
    from nltk.stem.snowball import SnowballStemmer

    return SnowballStemmer("english")


def _pieces(text: str) -> list[str]:
    """Rules 1-7 on one text."""
    stops = stop_words()
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES)
    out: list[str] = []
    for token in _tokenizer().tokenize(text):
        if _URL.search(token):
            continue
        token = token.lstrip("#")
        if token in stops:
            continue
        for piece in _NON_ALNUM.split(token.replace("'", "").lower()):
            if len(piece) >= 2 and piece not in stops and any(c.isalpha() for c in piece):
                out.append(piece)
    return out


@functools.lru_cache(maxsize=1 << 18)
def _words(text: str, depth: int = 0) -> tuple[str, ...]:
    """Rule 8: rules 1-7, then each piece again until it maps to itself (a fixed point)."""
    out: list[str] = []
    for piece in _pieces(text):
        again = _pieces(piece)
        if again == [piece] or depth >= _MAX_DEPTH:
            out.append(piece)
        else:
            out.extend(_words(piece, depth + 1))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 18)
def _terms(text: str, stem: bool) -> tuple[str, ...]:
    """Keywords of one text (rules 1-9 but sorting), cached: place classifiers and tags repeat."""
    words = _words(text)
    return tuple(_stemmer().stem(w) for w in words) if stem else words


def normalize_keywords(texts: str | Iterable[str | None] | None, *, stem: bool = False) -> list[str]:
    """Normalise free text into a sorted, duplicate-free list of keywords.

    Parameters
    ----------
    texts
        One string, or an iterable of strings (``None`` items are skipped): a tweet's text, a
        place's classifier type/category/subcategory and tags, a query's keywords.
    stem
        Apply the Snowball English stemmer to each keyword.

    Returns
    -------
    list[str]
        Sorted unique keywords; empty if the text has none (callers reject such records).

    Examples
    --------
    >>> normalize_keywords("Great #Coffee at O'Reilly's -- https://t.co/x @bob")
    ['coffee', 'great', 'oreillys']
    >>> normalize_keywords(["Food & Drink", "Coffee Shop", "coffee"])
    ['coffee', 'drink', 'food', 'shop']
    >>> normalize_keywords("8P")  # an emoticon to nltk, a keyword here
    ['8p']
    >>> normalize_keywords(["#covid19", "covid19"])
    ['covid']
    >>> normalize_keywords("running shoes", stem=True)
    ['run', 'shoe']
    """
    if texts is None:
        return []
    if isinstance(texts, str):
        texts = (texts,)
    terms: set[str] = set()
    for text in texts:
        if text:
            terms.update(_terms(str(text), bool(stem)))
    return sorted(terms)
