"""The worker's state rooms on their own: object handles (bulk lookup, keys, compaction, expiry),
the query table (a duplicate id refused before anything changes) and the initial lists' order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.encoding import id_prefix_keys
from knnmon.errors import InvalidQueryError
from knnmon.workers.object_handles import NO_TIME, ObjectHandles
from knnmon.workers.query_table import QueryTable
from knnmon.workers.registration import kept_entries


def test_handles_in_bulk_equal_handles_one_by_one_and_survive_compaction():
    bulk, single = ObjectHandles(), ObjectHandles()
    first = ["a", "b", "c"]
    got = bulk.handles_of(first, np.array([1, 2, 3]), id_prefix_keys(first))
    assert got.tolist() == [single.handle(o, t) for o, t in zip(first, [1, 2, 3])] == [0, 1, 2]
    again = bulk.handles_of(["c", "d", "a"], np.array([9, 4, 9]))  # known ids keep their handle and time
    assert again.tolist() == [2, 3, 0] and bulk.t[:4].tolist() == [1, 2, 3, 4]
    bulk.key_new()
    assert bulk.key[:4].tolist() == id_prefix_keys(["a", "b", "c", "d"]).tolist()
    with pytest.raises(ValueError, match="distinct"):
        bulk.handles_of(["e", "e"], np.array([5, 5]))
    assert len(bulk) == 4  # a refused call adds nothing
    assert bulk.forget(np.array([1])) == ["b"] and "b" not in bulk
    remap = bulk.compact(np.array([0, 3]))
    assert remap[[0, 3]].tolist() == [0, 1] and bulk.ids.tolist() == ["a", "d"] and bulk.live == 2
    assert bulk.lookup(["a", "d", "b"]).tolist() == [0, 1, -1] and bulk.t.tolist() == [1, 4]
    assert bulk.key.tolist() == id_prefix_keys(["a", "d"]).tolist()
    assert bulk.handle("z") == 2 and bulk.t[2] == NO_TIME


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "forget", "compact"]),
                                st.lists(st.integers(0, 40), min_size=1, max_size=12)), min_size=1, max_size=25),
       collide=st.booleans())
def test_handles_found_by_hash_runs_equal_a_dict(steps, collide):
    """Lookups through the sorted hash run and the recent dict (sealed every 4 handles here)
    equal a dict of id -> handle, through forgetting and compaction; with every hash equal, ids
    are still told apart by comparing them."""
    import knnmon.id_table as id_table

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(id_table, "SEAL", 4)
        if collide:
            mp.setattr(id_table, "id_hashes", lambda oids: np.zeros(len(oids), dtype=np.uint64))
        _handles_against_a_dict(steps)


def _handles_against_a_dict(steps) -> None:
    handles, model = ObjectHandles(), {}
    for op, xs in steps:
        if op == "add":
            ids = list(dict.fromkeys(f"o{x}" for x in xs))
            got = handles.handles_of(ids, np.zeros(len(ids), dtype=np.int64))
            for oid, h in zip(ids, got.tolist()):
                assert model.setdefault(oid, h) == h
        elif op == "forget":
            gone = sorted({model[f"o{x}"] for x in xs if f"o{x}" in model})
            for oid in handles.forget(np.array(gone, dtype=np.int64)):
                del model[oid]
        else:  # keep the known handles and one of every three forgotten ones
            used = np.array(sorted(set(model.values()) | set(range(0, len(handles), 3))), dtype=np.int64)
            remap = handles.compact(used)
            model = {oid: int(remap[h]) for oid, h in model.items()}
        probe = [f"o{x}" for x in range(42)]
        assert handles.lookup(probe).tolist() == [model.get(o, -1) for o in probe]
        assert all(handles.ids[h] == oid for oid, h in model.items())


def test_a_duplicate_query_id_is_refused_before_anything_changes():
    table = QueryTable()
    inf = np.full(2, np.inf)
    table.append(["q0", "q1"], [0.0, 1.0], [0.0, 1.0], [["cafe"], ["bar"]], [[0], [1]], np.array([1, 2]),
                 np.array([1, 2]), inf)
    probe = ["q0", "q1", "q2", "q3"]
    before = (table.ids.tolist(), table.slots(probe).tolist(), table.kw_code.copy(), table.lon.copy())
    for ids in (["q2", "q1"], ["q3", "q3"]):
        with pytest.raises(InvalidQueryError, match="already registered"):
            table.append(ids, [0.0, 0.0], [0.0, 0.0], [["x"], ["y"]], [[2], [3]], np.array([1, 1]), np.array([1, 1]),
                         inf)
        assert (table.ids.tolist(), table.slots(probe).tolist()) == before[:2]
        assert np.array_equal(table.kw_code, before[2]) and table.keywords.tolist() == ["cafe", "bar"]
        assert np.array_equal(table.lon, before[3]) and len(table.alive) == len(table.reach) == 2


@settings(max_examples=100, deadline=None)
@given(lists=st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "object-1", "object-2", "object-3", "zz"]),
                                         st.sampled_from([0.0, 1.5, 2.0])), max_size=6, unique_by=lambda e: e[0]),
                      max_size=5),
       caps=st.lists(st.integers(1, 4), min_size=5, max_size=5))
def test_kept_entries_are_each_list_sorted_by_distance_then_id_and_cut(lists, caps):
    cap = np.array(caps[:len(lists)], dtype=np.int64)
    q, rank, d, ids, keys = kept_entries(lists, cap)
    assert keys.tolist() == id_prefix_keys(ids).tolist()
    for i, lst in enumerate(lists):
        want = sorted((x, o) for o, x in lst)[:cap[i]]
        mine = q == i
        assert list(zip(d[mine].tolist(), [o for o, m in zip(ids, mine.tolist()) if m])) == want
        assert rank[mine].tolist() == list(range(len(want)))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "set", "drop", "compact"]),
                                st.lists(st.integers(0, 20), min_size=1, max_size=8)), min_size=1, max_size=20))
def test_held_texts_by_handle_equal_a_dict_through_expiry_and_compaction(steps):
    """A reserve's details kept by handle (:class:`HeldTexts`) read as a dict of id -> text does,
    through replacing, expiring (a forgotten id reads as none) and compaction."""
    from knnmon.workers.held_texts import HeldTexts

    handles = ObjectHandles()
    texts, model = HeldTexts(handles), {}
    for n, (op, xs) in enumerate(steps):
        ids = list(dict.fromkeys(f"o{x}" for x in xs))
        if op == "add":
            handles.handles_of(ids, np.zeros(len(ids), dtype=np.int64))
        elif op == "set":  # ids without a handle are skipped; a None leaves the text as it was
            values = [None if x % 3 == 0 else f"{x} {n} é" for x in xs[:len(ids)]] + [None] * (len(ids) - len(xs))
            texts.keep(handles.lookup(ids), values)
            model.update({o: v for o, v in zip(ids, values) if v is not None and o in handles})
        elif op == "drop":
            gone = handles.lookup(ids)
            gone = gone[gone >= 0]
            handles.forget(gone)
            texts.drop(gone)
            for o in ids:
                model.pop(o, None)
        else:
            used = np.flatnonzero(handles.ids.known(np.arange(len(handles))))
            handles.compact(used)
            texts.renumber(used)
        probe = [f"o{x}" for x in range(22)]
        assert texts.get(probe) == [model.get(o) for o in probe] and len(texts) == len(model)


def test_the_light_settings_name_every_index_a_worker_builds():
    """The coordinator checks ``workers.index`` against ``INDEX_NAMES`` without loading the worker."""
    from knnmon.workers.settings import INDEX_NAMES
    from knnmon.workers.state import INDEXES

    assert tuple(INDEXES) == INDEX_NAMES
