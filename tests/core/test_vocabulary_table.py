"""``VocabularyTable``: keyword -> code from Arrow string arrays' buffers, against a Python dict;
words added while another thread looks words up are found whole or not at all."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.vocabulary_table import VocabularyTable

words = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=100, deadline=None)
@given(vocab=st.lists(words, unique=True, max_size=60), probes=st.lists(words, max_size=40),
       added=st.lists(words, max_size=30), start=st.integers(0, 5), large=st.booleans())
def test_codes_are_a_dicts_codes(vocab, probes, added, start, large):
    """Probes given as a slice of a longer array (an offset into its buffers) or as large
    strings; words added later get the next codes, a word added twice keeps its code."""
    table = VocabularyTable(vocab)
    index = {w: i for i, w in enumerate(vocab)}
    for w in added:
        got = table.add(w)
        assert got == index.setdefault(w, len(index))
    assert len(table) == len(index)
    arr = pa.array(["pad"] * start + probes + vocab, type=pa.large_string() if large else pa.string())
    arr = arr.slice(start)
    want = [index.get(w, -1) for w in probes + vocab]
    assert table.codes(arr).tolist() == want
    assert table.codes(pa.chunked_array([arr.slice(0, len(probes)), arr.slice(len(probes))],
                                        type=arr.type)).tolist() == want


def test_nulls_and_repeats():
    table = VocabularyTable(pa.array(["x", "yy"]))
    assert table.codes(pa.array([None, "yy", "x", "z"])).tolist() == [-1, 1, 0, -1]
    assert table.code("yy") == 1 and table.code("") == -1
    with pytest.raises(ValueError, match="distinct"):
        VocabularyTable(["a", "b", "a"])
    with pytest.raises(TypeError, match="string array"):
        table.codes(pa.array([1, 2]))


def test_words_added_while_another_thread_reads_are_whole_or_absent():
    """One thread adds 20,000 words (the arrays grow and are replaced many times) while another
    looks all of them up again and again: a code found is always that word's."""
    base = [f"w{i}" for i in range(1000)]
    new = [f"new-{i}-{'x' * (i % 7)}" for i in range(20_000)]
    table = VocabularyTable(base)
    probe = pa.array(base + new)
    stop, errors = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            got = table.codes(probe)
            found = got >= 0
            # word i of the probe has code i (the words are added in order)
            if not np.array_equal(got[found], np.flatnonzero(found)) or not found[:1000].all():
                errors.append(got)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for w in new:
            table.add(w)
    finally:
        stop.set()
        t.join()
    assert not errors
    assert np.array_equal(table.codes(probe), np.arange(len(probe)))


def test_the_same_without_the_jit():
    """The kernels as plain Python (``NUMBA_DISABLE_JIT=1``) pass the dict test too."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "dicts_codes or nulls"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
