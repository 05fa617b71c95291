"""The object kNN index: exact against the brute-force oracle, serial and forked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.ingest.reading import read_objects
from knnmon.oracle import BruteForceKnn
from knnmon.coordinator.runtime.object_index import ObjectIndex


def as_lists(idx, counts, dist, ids):
    out, start = [], 0
    for c in counts:
        out.append([(str(ids[i]), float(d)) for i, d in zip(idx[start:start + c], dist[start:start + c])])
        start += c
    return out


def test_equals_the_oracle_on_real_places(places_slice):
    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    index, oracle = ObjectIndex(objects), BruteForceKnn(objects)
    rng = np.random.default_rng(2)
    rows = objects.take(pa.array(rng.choice(objects.num_rows, 400, replace=False))).to_pylist()
    words = list(index.vocabulary)
    kws = [r["keywords"][:2] + ([words[i]] if i % 3 == 0 else []) for i, r in enumerate(rows)]  # OR of 1-3
    k = rng.integers(1, 25, size=len(rows))
    lon = np.array([r["lon"] for r in rows]) + rng.normal(0, 0.01, len(rows))
    lat = np.array([r["lat"] for r in rows]) + rng.normal(0, 0.01, len(rows))
    got = as_lists(*index.knn_v(lon, lat, kws, k), index.ids)
    for i in range(len(rows)):
        want = oracle.knn(lon[i], lat[i], kws[i], int(k[i]))
        assert [g[0] for g in got[i]] == [w[0] for w in want]
        assert [g[1] for g in got[i]] == pytest.approx([w[1] for w in want], rel=1e-12)
    r = index.kth_distance_m(lon, lat, kws, k)
    for i in range(len(rows)):
        assert r[i] == (got[i][-1][1] if len(got[i]) == k[i] else np.inf)


def _searches(places_slice, seed: int):
    """The slice's objects, their index and oracle, a generator, and 300 searches at sampled
    objects' places with up to 3 of their keywords: ``(lon, lat, keywords, k)``."""
    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    rng = np.random.default_rng(seed)
    rows = objects.take(pa.array(rng.choice(objects.num_rows, 300, replace=False))).to_pylist()
    lon, lat = np.array([r["lon"] for r in rows]), np.array([r["lat"] for r in rows])
    kws, k = [r["keywords"][:3] for r in rows], rng.integers(1, 12, size=len(rows))
    return objects, ObjectIndex(objects), BruteForceKnn(objects), rng, (lon, lat, kws, k)


def test_searches_beside_a_tree_build_in_steps_on_another_thread_equal_the_oracle(places_slice):
    """A start builds every tree on a thread of its own, a step of keywords at a time, while
    searches build the ones they need: every answer is exact, and every tree ends built."""
    import threading

    _, index, oracle, _, (lon, lat, kws, k) = _searches(places_slice, seed=8)
    build = threading.Thread(target=index.build_trees, args=(64,))
    build.start()
    got = [as_lists(*index.knn_v(lon[s:s + 10], lat[s:s + 10], kws[s:s + 10], k[s:s + 10]), index.ids)
           for s in range(0, len(lon), 10)]
    build.join()
    assert index.trees_built == index.n_keywords
    for i in range(len(lon)):
        want = oracle.knn(lon[i], lat[i], kws[i], int(k[i]))
        assert [g[0] for g in got[i // 10][i % 10]] == [w[0] for w in want]


def test_trees_are_built_for_the_keywords_searched_and_again_after_they_are_dropped(places_slice):
    """A search builds the trees of its keywords only; after ``drop_trees`` they are built again
    on use; every answer equals the one before, with only live objects when told."""
    objects, index, oracle, rng, (lon, lat, kws, k) = _searches(places_slice, seed=5)
    want = as_lists(*index.knn_v(lon[:20], lat[:20], kws[:20], k[:20]), index.ids)
    assert 0 < index.trees_built == len({w for kw in kws[:20] for w in kw} & set(index.vocabulary))
    index.drop_trees()
    assert index.trees_built == 0
    assert as_lists(*index.knn_v(lon[:20], lat[:20], kws[:20], k[:20]), index.ids) == want
    alive = rng.random(objects.num_rows) < 0.3  # a window's live objects
    live = BruteForceKnn(objects.filter(pa.array(alive)))
    got = as_lists(*index.knn_v(lon, lat, kws, k, alive=alive), index.ids)
    for i in range(len(lon)):
        assert [g[0] for g in got[i]] == [w[0] for w in live.knn(lon[i], lat[i], kws[i], int(k[i]))]
    assert oracle.knn(lon[0], lat[0], kws[0], int(k[0])) == as_lists(*index.knn_v(lon[:1], lat[:1], kws[:1], k[:1]),
                                                                      index.ids)[0]


@settings(max_examples=80, deadline=None)
@given(points=st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(0, 2)), min_size=1, max_size=60),
       queries=st.lists(st.tuples(st.integers(-4, 4), st.integers(-4, 4), st.integers(0, 2), st.integers(1, 9)),
                        min_size=1, max_size=6),
       jit=st.booleans(), data=st.data())
def test_a_kd_search_finds_the_nearest_and_every_tie_at_the_cut(points, queries, jit, data):
    """:func:`kd_knn` against sorting every squared chord (points on a coarse lattice: many share
    a place or a distance; three keywords; some objects not live, the node boxes fitted to the
    live ones or not; some searches bounded, often right at a point's distance), compiled and as
    plain Python."""
    from knnmon.coordinator.runtime import keyword_kd
    from knnmon.geo import unit_vectors

    build, knn = (keyword_kd.kd_build, keyword_kd.kd_knn) if jit else \
        (keyword_kd.kd_build.py_func, keyword_kd.kd_knn.py_func)
    xyz = unit_vectors(np.array([p[0] for p in points]) * 0.01, np.array([p[1] for p in points]) * 0.01)
    code_of = np.array([p[2] for p in points])
    post = np.argsort(code_of, kind="stable").astype(np.int32)
    ptr = np.searchsorted(code_of[post], np.arange(4)).astype(np.int64)
    rows, dims, box = post.copy(), np.zeros(len(post), dtype=np.int8), np.zeros((len(post), 6))
    build(xyz, rows, dims, box, ptr, np.arange(3, dtype=np.int64))
    for c in range(3):  # each keyword's list is still its own objects
        assert sorted(rows[ptr[c]:ptr[c + 1]].tolist()) == sorted(post[ptr[c]:ptr[c + 1]].tolist())
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=len(points), max_size=len(points))), dtype=bool) \
        if data.draw(st.booleans()) else np.zeros(0, dtype=bool)
    if len(alive) and (~alive).any() and data.draw(st.booleans()):  # boxes fitted to the live ones
        refit = keyword_kd.kd_refit if jit else keyword_kd.kd_refit.py_func
        dead = np.flatnonzero(~alive)  # in groups of up to 2 (in any order: each group's nodes are refitted)
        starts = np.arange(0, len(dead), 2)
        refit(xyz, rows, box, ptr, np.ones(3, dtype=bool), alive, np.minimum.reduceat(xyz[dead], starts, axis=0),
              np.maximum.reduceat(xyz[dead], starts, axis=0), np.append(starts, len(dead)).astype(np.int64),
              code_of[dead].astype(np.int64))
    q = unit_vectors(np.array([x[0] for x in queries]) * 0.01, np.array([x[1] for x in queries]) * 0.01)
    code = np.array([x[2] for x in queries], dtype=np.int64)
    want = np.array([x[3] for x in queries], dtype=np.int64)
    every = ((xyz[None, :, :] - q[:, None, :]) ** 2).sum(axis=2)  # (queries, points) squared chords
    bound = np.array([np.inf if not data.draw(st.booleans()) else
                      float(every[j, data.draw(st.integers(0, len(points) - 1))]) for j in range(len(queries))])
    counts, found = knn(xyz, rows, dims, box, ptr, alive, code, q, want, bound)
    at = 0
    for j in range(len(queries)):
        mine = np.flatnonzero((code_of == code[j]) & (alive if len(alive) else True))
        d2 = ((xyz[mine] - q[j]) ** 2).sum(axis=1)
        mine, d2 = mine[d2 <= bound[j]], d2[d2 <= bound[j]]
        cut = np.sort(d2)[min(want[j], len(mine)) - 1] if len(mine) else -1.0
        assert sorted(found[at:at + counts[j]].tolist()) == mine[d2 <= cut].tolist()
        at += counts[j]
    assert at == len(found)


def test_forked_equals_serial(places_slice):
    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    index = ObjectIndex(objects)
    rng = np.random.default_rng(4)
    rows = objects.take(pa.array(rng.integers(0, objects.num_rows, 25_000))).to_pylist()
    args = (np.array([r["lon"] for r in rows]), np.array([r["lat"] for r in rows]),
            pa.array([r["keywords"][:1] for r in rows]), rng.integers(1, 8, len(rows)))
    serial = index.knn_v(*args)
    forked = index.knn_v(*args, processes=2)
    for a, b in zip(serial, forked):
        assert np.array_equal(a, b)


def test_a_search_split_over_two_threads_equals_one_thread(places_slice, monkeypatch):
    """A call of many searches runs its second half on a second thread: the same answer, with
    and without a window's live objects, as one thread gives."""
    from knnmon.coordinator.runtime import object_index

    objects = read_objects(str(places_slice), ["id", "lon", "lat", "keywords"])
    index = ObjectIndex(objects)
    rng = np.random.default_rng(8)
    rows = objects.take(pa.array(rng.integers(0, objects.num_rows, 3000))).to_pylist()
    args = (np.array([r["lon"] for r in rows]) + 0.01, np.array([r["lat"] for r in rows]),
            [r["keywords"][:2] for r in rows], rng.integers(1, 12, len(rows)))
    alive = rng.random(objects.num_rows) < 0.5
    monkeypatch.setattr(object_index, "SPLIT_SEARCHES", 10**9)
    one = [index.knn_v(*args), index.knn_v(*args, alive=alive)]
    monkeypatch.setattr(object_index, "SPLIT_SEARCHES", 100)
    two = [index.knn_v(*args), index.knn_v(*args, alive=alive)]
    assert object_index._SECOND is not None  # the second thread searched
    for a, b in zip(one, two):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


def test_ties_fewer_than_k_antimeridian_and_poles():
    t = pa.table({
        "id": ["b", "a", "c", "w", "e", "p1", "p2"],
        "lon": [10.0, 10.0, 10.001, -179.999, 179.999, 0.0, 180.0],
        "lat": [45.0, 45.0, 45.0, 0.0, 0.0, 89.999, 89.999],
        "keywords": [["x"], ["x"], ["x", "y"], ["z"], ["z"], ["pole"], ["pole"]],
    })
    index, oracle = ObjectIndex(t), BruteForceKnn(t)
    cases = [(10.0, 45.0, ["x"], 2), (10.0, 45.0, ["y"], 5), (180.0, 0.0, ["z"], 1), (90.0, 90.0, ["pole"], 2),
             (0.0, 0.0, ["nothing"], 3)]
    got = as_lists(*index.knn_v([c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases],
                                [c[3] for c in cases]), index.ids)
    assert [g[0] for g in got[0]] == ["a", "b"]            # tie at distance 0, smaller id first
    assert [g[0] for g in got[1]] == ["c"]                  # fewer than k
    assert got[2][0][1] == pytest.approx(111.19, rel=1e-3)  # across the 180th meridian
    assert len(got[3]) == 2 and got[3][0][1] == pytest.approx(got[3][1][1])
    assert got[4] == []
    for case, g in zip(cases, got):
        assert [x[0] for x in g] == [x[0] for x in oracle.knn(case[0], case[1], case[2], case[3])]


@pytest.mark.parametrize("background,fit_at_search", [(False, False), (True, False), (True, True)])
def test_a_windowed_store_in_many_parts_equals_the_oracle_over_the_live_objects(places_slice, monkeypatch, background,
                                                                                fit_at_search):
    """The live objects sealed into parts of a few hundred (merged as an LSM tree, half-dead
    ones rebuilt; on the compactor's thread or at once), searched largest first, each part within
    the k-th distance of the parts before: every query's kNN equals the brute-force oracle over
    the live objects, after each expiry, whichever builds are done; also with the parts' boxes
    fitted to their live objects only before a search (as before a refill wave's)."""
    from knnmon.coordinator.runtime import object_store, window_parts
    from knnmon.coordinator.runtime.object_store import ObjectStore
    from knnmon.coordinator.runtime.preparation import with_arrival_times
    from knnmon.ingest.reading import stream_order

    monkeypatch.setattr(object_store, "SEAL", 200)
    if fit_at_search:
        monkeypatch.setattr(object_store, "FIT_BEFORE_SEARCHES", 1)
        monkeypatch.setattr(window_parts, "REFIT_MIN", 10**9)
    objects = with_arrival_times(stream_order(read_objects(str(places_slice)), None), 1000)
    window = 2500 * 1000
    store = ObjectStore(objects.slice(0, 2000).slice(0, 0), background=background)
    rng = np.random.default_rng(3)
    checked, most, fits = 0, 0, 0
    for start in range(0, 8000, 250):
        batch = objects.slice(start, 250)
        store.append(batch)
        t = objects.slice(0, start + 250).column("t").to_numpy()
        store.expire(int(t.max()) - window)
        live = objects.slice(0, start + 250).filter(pa.array(t > t.max() - window))
        if start % 1000 != 750:
            store.knn_v([0.0], [0.0], [["x"]], [1])  # parts seal as a service's refills make them
            continue
        oracle = BruteForceKnn(live)
        pick = live.take(pa.array(rng.choice(live.num_rows, 60, replace=False)))
        lon, lat = pick.column("lon").to_numpy() + 0.01, pick.column("lat").to_numpy()
        kws = [w[:2] for w in pick.column("keywords").to_pylist()]
        k = rng.integers(1, 12, size=60)
        topk, _ = store.knn_v(lon, lat, kws, k)
        if fit_at_search:
            fits += sum(p.fitted is not None and p.fitted == p.cutoff for p in store._parts if p.alive is not None)
        most = max(most, len(store._parts) + bool(store._batches))  # the parts and the tail searched
        for i in range(60):
            assert [o for o, _ in topk[i]] == [o for o, _ in oracle.knn(lon[i], lat[i], kws[i], int(k[i]))]
        checked += 1
    store.compactor.wait()
    store.expire(int(t.max()) - window)  # the last build swapped in
    assert checked >= 7 and most >= 2 and store.compactor.builds >= 5
    assert fits >= 3 or not fit_at_search
    store.close()


@pytest.mark.parametrize("regional", (True, False), ids=("a region expires", "objects expire all over"))
def test_a_fit_that_empties_no_node_makes_the_next_wait_longer(regional):
    """A part's fit (``Compactor.fit``) that emptied next to no node of the trees (objects expiring
    here and there) makes the next fit wait twice as many expired objects; a fit that emptied a
    region's nodes does not."""
    from knnmon.coordinator.runtime.window_parts import REFIT_MIN, REFIT_NODES, Compactor, Part

    n, rng = 8000, np.random.default_rng(5)
    east = np.arange(n) % 2 == 0  # two regions 30 degrees apart, objects alternating
    t = np.arange(n, dtype=np.int64) if not regional else np.where(east, np.arange(n) // 2, n // 2 + np.arange(n) // 2)
    lon = np.where(east, -71.0, -101.0) + rng.uniform(0, 1, n)
    table = pa.table({"id": [f"o{i:05d}" for i in range(n)], "lon": lon, "lat": 40.0 + rng.uniform(0, 1, n), "t": t,
                      "keywords": [["cafe"]] * n})
    part = Part.of(table)
    part.index.build_trees()
    fits = Compactor(background=False)
    fits.fit([part.expire(n // 2 - 1)])  # half of them: the east region, or every other object of both
    assert part.fitted == n // 2 - 1 and part.fit_wait == (1 if regional else 2) and part.fit_nodes < REFIT_NODES
    fits.fit([part.expire(n // 2 - 1 + REFIT_MIN * 3 // 2)])
    assert (part.fitted == n // 2 - 1 + REFIT_MIN * 3 // 2) is regional
