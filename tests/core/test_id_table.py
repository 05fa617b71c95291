"""Strings in columns (:mod:`knnmon.id_table`) against a list and a dict: rows, lookups, forgetting
and keeping, with ids of any Unicode, empty strings, and every hash forced equal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import knnmon.id_table as id_table
from knnmon.id_table import IdTable, StringColumn

# Any text but lone surrogates (what knnmon.limits rejects: not UTF-8).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=80, deadline=None)
@given(chunks=st.lists(st.lists(TEXT, max_size=20), max_size=6), data=st.data())
def test_a_string_column_equals_a_list(chunks, data):
    col, model = StringColumn(), []
    for chunk in chunks:
        assert col.append(chunk) == range(len(model), len(model) + len(chunk))
        model += chunk
    assert len(col) == len(model) and col.tolist() == model
    assert [col[i] for i in range(len(model))] == model
    if model:
        rows = data.draw(st.lists(st.integers(0, len(model) - 1), max_size=40))
        assert col.names(rows) == [model[r] for r in rows] == col.names(np.array(rows, dtype=np.int64))
        keep = np.array(sorted(set(data.draw(st.lists(st.integers(0, len(model) - 1))))), dtype=np.int64)
        col.keep(keep)
        model = [model[r] for r in keep.tolist()]
        assert col.tolist() == model
        col.append(["after"])
        assert col.tolist() == model + ["after"]
    with pytest.raises(IndexError):
        col[len(col)]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "forget", "keep"]), st.lists(st.integers(0, 30), max_size=10)),
                      max_size=25), collide=st.booleans(), prefix=st.sampled_from(["o", "é", "店"]))
def test_an_id_table_finds_what_a_dict_finds(steps, collide, prefix):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(id_table, "SEAL", 3)
        if collide:
            mp.setattr(id_table, "id_hashes", lambda ids: np.zeros(len(ids), dtype=np.uint64))
        table, model = IdTable(), {}  # model: id -> row, for the findable ids
        for op, xs in steps:
            names = list(dict.fromkeys(f"{prefix}{x}" for x in xs))
            if op == "add":
                new = [n for n in names if n not in model]
                model.update(zip(new, table.add(new)))
            elif op == "forget":
                rows = np.array(sorted(model[n] for n in names if n in model), dtype=np.int64)
                assert sorted(table.forget(rows)) == sorted(n for n in names if n in model)
                model = {n: r for n, r in model.items() if n not in names}
            else:  # keep the findable rows and every other forgotten one
                keep = np.array(sorted(set(model.values()) | set(range(0, len(table), 2))), dtype=np.int64)
                table.keep(keep)
                at = {int(r): i for i, r in enumerate(keep.tolist())}
                model = {n: at[r] for n, r in model.items()}
            probe = [f"{prefix}{x}" for x in range(32)]
            assert table.lookup(probe).tolist() == [model.get(p, -1) for p in probe]
            assert all(table[r] == n for n, r in model.items()) and all(n in table for n in model)
            assert table.get("missing") is None and 7 not in table
