"""Regions added to the routing table at run time (``LiveRouting.add_many``: registrations, a
window's refills, hand-overs): every (keyword, cell) routes to exactly the workers of the regions
covering it, through the delta and its folds into the main table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.assignment.routing import RoutingTable
from knnmon.coordinator.live_routing import MAX_ENTRIES_PER_QUERY, LiveRouting
from knnmon.grid import Grid

region = st.tuples(st.lists(st.integers(0, 5), max_size=3, unique=True), st.integers(0, 15), st.integers(0, 15),
                   st.integers(0, 15), st.integers(0, 15), st.integers(0, 63))


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.lists(region, max_size=40), min_size=1, max_size=8), n=st.sampled_from([2, 16]),
       as_words=st.booleans(), merged=st.lists(st.booleans(), min_size=8, max_size=8))
def test_every_cell_routes_to_the_workers_of_the_regions_covering_it(calls, n, as_words, merged):
    """Codes given as lists, or as the queries' keywords in one Arrow array (``codes_of``); the
    journal, replayed onto a table as it was, gives the same routes. Regions added without their
    merge (a refill's, before its batch is sent) route at once, after every call, and the same
    once merged."""
    import pyarrow as pa

    grid = Grid(-10.0, 0.0, 10.0, 20.0, n=n)

    def empty() -> LiveRouting:
        return LiveRouting(RoutingTable(grid, [str(i) for i in range(6)], np.zeros(6, dtype=np.uint64),
                                        np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)))

    table = empty()
    want = np.zeros((6, n * n), dtype=np.uint64)  # brute force: (code, cell) -> workers
    table.journal(True)
    for i, call in enumerate(calls):
        call = [(cs, min(a, n - 1), min(b, n - 1), min(max(a, c), n - 1), min(max(b, d), n - 1), w)
                for cs, a, b, c, d, w in call]
        codes = table.codes_of(pa.array([[str(x) for x in c[0]] for c in call], type=pa.list_(pa.string()))) \
            if as_words else [c[0] for c in call]
        table.add_many(codes, *(np.array([c[j] for c in call], dtype=np.int64) for j in range(1, 6)), merge=merged[i])
        for cs, x0, y0, x1, y1, w in call:
            cells = [y * n + x for y in range(y0, y1 + 1) for x in range(x0, x1 + 1)]
            everywhere = (x0, y0, x1, y1) == (0, 0, n - 1, n - 1) or len(cells) * len(cs) > MAX_ENTRIES_PER_QUERY
            for c in cs:
                want[c, slice(None) if everywhere else cells] |= np.uint64(1) << np.uint64(w)
        code, cell = np.divmod(np.arange(6 * n * n), n * n)
        assert np.array_equal(table.route_v(cell, np.arange(6 * n * n), code), want.ravel())
    table.merge_pending()
    journal = table.journal(False)
    assert len(journal) == len(calls)
    replayed = empty()
    replayed.replay(journal)
    for keys in (table.table.keys, table.delta_keys):
        assert np.all(np.diff(keys) > 0)  # sorted, unique
    code, cell = np.divmod(np.arange(6 * n * n), n * n)
    got = table.route_v(cell, np.arange(6 * n * n), code)
    assert np.array_equal(got, want.ravel())
    assert np.array_equal(replayed.route_v(cell, np.arange(6 * n * n), code), want.ravel())


def test_codes_of_gives_a_new_keyword_its_code():
    """A refill's or a registration's keywords in one Arrow array: known ones by their codes, a
    new one added to the vocabulary (as :meth:`LiveRouting.code` adds it)."""
    import pyarrow as pa

    table = LiveRouting(RoutingTable(Grid(-10.0, 0.0, 10.0, 20.0, n=4), ["a", "b"], np.zeros(2, dtype=np.uint64),
                                     np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)))
    counts, codes = table.codes_of(pa.array([["b"], [], ["new", "a"]], type=pa.list_(pa.string())))
    assert counts.tolist() == [1, 0, 2] and codes.tolist() == [1, 2, 0]
    assert table.table.vocabulary == ["a", "b", "new"] and table.code("new") == 2


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.tuples(st.lists(st.integers(0, 60), max_size=40), st.integers(0, 63)), min_size=1, max_size=6),
       mixed=st.booleans())
def test_merged_entries_are_the_sorted_keys_with_their_workers_bits_or_ed(parts, mixed):
    """The packed sort (one worker's bit per part) and np.unique's way give the same table; a
    part holding two workers' bits together takes the latter."""
    from knnmon.assignment.region_entries import merge_entries

    key_parts = [np.asarray(k, dtype=np.int64) for k, _ in parts]
    bit_parts = [np.full(len(k), np.uint64(1) << np.uint64(w), dtype=np.uint64) for k, w in parts]
    if mixed and len(bit_parts[0]):
        bit_parts[0] = bit_parts[0] | np.uint64(1)
    keys, masks = merge_entries(key_parts, bit_parts)
    want_keys = np.unique(np.concatenate(key_parts))
    want = {int(k): 0 for k in want_keys}
    for k, b in zip(key_parts, bit_parts):
        for x, y in zip(k.tolist(), b.tolist()):
            want[x] |= y
    assert keys.tolist() == want_keys.tolist() and masks.tolist() == [want[k] for k in keys.tolist()]
    assert masks.dtype == np.uint64 and keys.dtype == np.int64


worker_region = st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), st.integers(0, 7),
                          st.integers(0, 7), st.integers(0, 7), st.integers(0, 7), st.integers(0, 3),
                          st.booleans())


@settings(max_examples=150, deadline=None)
@given(regions=st.lists(worker_region, min_size=1, max_size=30), source=st.integers(0, 3),
       merged=st.booleans(), wide=st.lists(st.integers(0, 5), max_size=2))
def test_narrowing_a_source_keeps_exactly_what_its_remaining_queries_need(regions, source, merged, wide):
    """Queries (keywords, rectangle, worker, moved?) routed; the moved ones of ``source`` leave it
    and ``narrow`` withdraws it from their keywords but where its remaining queries need them.
    Every (keyword, cell) still routes to every worker a remaining query there needs (nothing
    lost); for the moved keywords the source is routed exactly where its remaining queries are,
    unless it holds a keyword everywhere (``wide``, or a region over the whole grid: the
    keyword's ``always`` mask) that a remaining query has. A journal of the calls replayed onto
    the table as it was gives the same."""
    from knnmon.assignment.region_entries import region_entries

    n = 8
    grid = Grid(-10.0, 0.0, 10.0, 20.0, n=n)
    always = np.zeros(6, dtype=np.uint64)
    for c in wide:
        always[c] |= np.uint64(1) << np.uint64(source)
    table = LiveRouting(RoutingTable(grid, [str(i) for i in range(6)], always.copy(), np.empty(0, dtype=np.int64),
                                     np.empty(0, dtype=np.uint64)))
    before = LiveRouting(RoutingTable(grid, list(table.table.vocabulary), always.copy(), np.empty(0, dtype=np.int64),
                                      np.empty(0, dtype=np.uint64)))
    rows = [(cs, min(a, c), min(b, d), min(max(a, c), n - 1), min(max(b, d), n - 1), w, moved and w == source)
            for cs, a, b, c, d, w, moved in regions]
    args = ([r[0] for r in rows], *(np.array([r[j] for r in rows], dtype=np.int64) for j in range(1, 6)))
    table.add_many(*args, merge=merged)
    before.add_many(*args)
    table.journal(True)
    moved_codes = np.array(sorted({c for r in rows if r[6] for c in r[0]}), dtype=np.int64)
    left = [r for r in rows if r[5] == source and not r[6]]
    pair = [(c, r) for r in left for c in r[0] if c in set(moved_codes.tolist())]
    held = np.isin(moved_codes, [c for c, _ in pair])
    keep = np.empty(0, dtype=np.int64)
    if pair:
        rect = (np.array([r[j] for _, r in pair]) for j in (1, 2, 3, 4))
        keep, _ = region_entries(np.array([c for c, _ in pair]), *rect, np.ones(len(pair), dtype=np.uint64), n)
    everywhere = table.table.always.copy()  # (wide, and any full-grid region added)
    table.narrow(source, moved_codes, held, keep)
    need = np.zeros((6, n * n), dtype=np.uint64)  # what the queries left on each worker need
    for cs, x0, y0, x1, y1, w, moved in rows:
        if not moved:
            for c in cs:
                need[c].reshape(n, n)[y0:y1 + 1, x0:x1 + 1] |= np.uint64(1) << np.uint64(w)
    code, cell = np.divmod(np.arange(6 * n * n), n * n)
    got = table.route_v(cell, np.arange(6 * n * n), code).reshape(6, n * n)
    assert np.all(got & need == need)  # nothing a remaining query needs is lost
    bit = np.uint64(1) << np.uint64(source)
    for c, h in zip(moved_codes.tolist(), held.tolist()):
        if h and everywhere[c] & bit:
            continue  # held everywhere while a remaining query has it: untouched
        assert np.array_equal(got[c] & bit, need[c] & bit)  # the source only where it is needed
    replayed = before
    replayed.replay(table.journal(False))
    assert np.array_equal(replayed.route_v(cell, np.arange(6 * n * n), code), got.ravel())
