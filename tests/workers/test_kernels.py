"""The worker's compiled kernels against plain Python: the chord pre-test never drops a pair
within ``r_q``, and the top-k merge keeps exactly the ``cap`` nearest by (distance, id) with the
right entered / left / before entries, on data full of exact ties and shared id prefixes; the
holder counts match counting by dict. The
same tests run again with the JIT disabled (``NUMBA_DISABLE_JIT=1``), so a failure can be read
in plain Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from knnmon.encoding import id_prefix_keys
from knnmon.geo import chord2_bound, haversine_m, unit_vectors
from knnmon.workers import kernels


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), q=st.integers(1, 20))
def test_chord_pretest_keeps_every_pair_within_the_radius(seed, n, q):
    rng = np.random.default_rng(seed)
    lon, lat = rng.uniform(-180, 180, n), rng.uniform(-89, 89, n)
    qlon, qlat = rng.uniform(-180, 180, q), rng.uniform(-89, 89, q)
    obj, slot = np.repeat(np.arange(n), q), np.tile(np.arange(q), n)
    d = haversine_m(lon[obj], lat[obj], qlon[slot], qlat[slot])
    radius = np.quantile(d, rng.uniform(0, 1, q))  # some pairs inside, some outside
    radius[rng.uniform(size=q) < 0.2] = np.inf
    reach = np.column_stack([unit_vectors(qlon, qlat), chord2_bound(radius)])
    u = unit_vectors(lon, lat)
    sel = kernels.chord_pretest(*(np.ascontiguousarray(u[:, i]) for i in range(3)), obj, slot, reach)
    assert set(np.flatnonzero(d <= radius[slot]).tolist()) <= set(sel.tolist())
    assert np.all(np.diff(sel) > 0)


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.integers(-50, 50), max_size=60), probe=st.lists(st.integers(-60, 60), max_size=40),
       sort=st.booleans())
def test_the_galloping_search_equals_searchsorted(keys, probe, sort):
    keys = np.unique(np.array(keys, dtype=np.int64))
    probe = np.array(sorted(probe) if sort else probe, dtype=np.int64)
    assert kernels._sorted_search(keys, probe).tolist() == np.searchsorted(keys, probe).tolist()


def _case(rng: np.random.Generator, prefix: str):
    """Query lists with ties and a batch of pairs (several per object and query)."""
    q = int(rng.integers(1, 8))
    k = rng.integers(1, 5, q).astype(np.int64)
    cap = k + rng.integers(0, 3, q)
    ptr = (np.cumsum(cap) - cap).astype(np.int64)
    count = np.minimum(rng.integers(0, 7, q), cap).astype(np.int64)
    old_ids = [f"{prefix}{i:05d}" for i in rng.permutation(500)[:int(count.sum())]]
    top_d, top_h = np.full(int(cap.sum()), np.inf), np.full(int(cap.sum()), -1, dtype=np.int64)
    h = 0
    for s in range(q):
        d = np.sort(rng.integers(0, 6, count[s]) * 10.0)
        top_d[ptr[s]:ptr[s] + count[s]] = d
        top_h[ptr[s]:ptr[s] + count[s]] = np.arange(h, h + count[s])
        h += count[s]
    radius = np.where(count == cap, top_d[ptr + cap - 1], np.inf)
    n = int(rng.integers(1, 15))
    new_ids = [f"{prefix}{i:05d}" for i in rng.permutation(np.arange(500, 1000))[:n]]
    p = int(rng.integers(0, 40))
    obj, slot = rng.integers(0, n, p).astype(np.int64), rng.integers(0, q, p).astype(np.int64)
    dist = {(o, s): float(rng.integers(0, 7) * 10.0) for o, s in zip(obj.tolist(), slot.tolist())}
    d = np.array([dist[(o, s)] for o, s in zip(obj.tolist(), slot.tolist())])
    return (k, cap, ptr, count, top_d, top_h, radius, old_ids), (obj, slot, d, new_ids)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefix=st.sampled_from(["o", "object-"]))
def test_merge_keeps_the_nearest_by_distance_then_id(seed, prefix):
    rng = np.random.default_rng(seed)
    (k, cap, ptr, count, top_d, top_h, radius, old_ids), (obj, slot, d, new_ids) = _case(rng, prefix)
    before_d, before_h, before_count = top_d.copy(), top_h.copy(), count.copy()
    out = kernels.merge_topk(obj, slot, d, id_prefix_keys(new_ids), radius, k, cap, ptr, count, top_d, top_h,
                             id_prefix_keys(old_ids), len(new_ids))
    (passed, changed, in_result, e_slot, e_obj, e_d, e_place, l_slot, l_h, b_slot, b_h, fallback, f_slot, f_obj,
     f_d) = out
    name = lambda h: old_ids[h] if h >= 0 else new_ids[-1 - h]  # noqa: E731
    n_within = 0
    for s in range(len(k)):
        a, c = ptr[s], before_count[s]
        old = [(before_d[a + i], old_ids[before_h[a + i]], int(before_h[a + i])) for i in range(c)]
        new = {(float(dd), new_ids[o], -1 - o) for o, sl, dd in zip(obj.tolist(), slot.tolist(), d.tolist())
               if sl == s and dd <= radius[s]}
        n_within += len(new)
        want = sorted(old + list(new), key=lambda e: (e[0], e[1]))[:cap[s]]
        gained = any(e[2] < 0 for e in want)
        if s in fallback.tolist():  # ties sharing a prefix: left to the ids, untouched here
            assert prefix == "object-" and count[s] == c and np.array_equal(top_h[a:a + cap[s]], before_h[a:a + cap[s]])
            assert sorted(zip(f_d[f_slot == s].tolist(), f_obj[f_slot == s].tolist())) == \
                sorted((e[0], -1 - e[2]) for e in new)
            continue
        got = [(top_d[a + i], name(top_h[a + i])) for i in range(count[s])]
        if not gained:
            assert s not in changed.tolist() and count[s] == c
            assert sorted(got) == sorted((e[0], e[1]) for e in old)
            continue
        assert s in changed.tolist()
        assert sorted(got) == sorted((e[0], e[1]) for e in want)  # the kept set, ties by id
        assert [g[0] for g in got] == sorted(g[0] for g in got)  # nearest first
        assert (s in in_result.tolist()) == any(e[2] < 0 for e in want[:k[s]])
        assert sorted(new_ids[o] for o in e_obj[e_slot == s].tolist()) == sorted(e[1] for e in want if e[2] < 0)
        assert all(name(top_h[p]) == new_ids[o] for p, o in zip(e_place[e_slot == s], e_obj[e_slot == s]))
        left = {e[1] for e in old} - {e[1] for e in want}
        assert sorted(old_ids[h] for h in l_h[l_slot == s].tolist()) == sorted(left)
        assert b_h[b_slot == s].tolist() == before_h[a:a + min(c, k[s])].tolist()
    assert passed[0] == n_within
    assert np.all(np.diff(changed) > 0) and np.all(np.diff(e_slot) >= 0) and np.all(np.diff(l_slot) >= 0)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), e=st.integers(0, 40), l_=st.integers(0, 40), buckets=st.integers(1, 3))
def test_count_holders_matches_counting_by_dict(seed, e, l_, buckets):
    """Entries first, then departures: the details written are the (handle, bucket)s held
    after that were not before, those deleted the ones no result holds after."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 3, (12, buckets)).astype(np.int32)
    before = {(h, b): int(counts[h, b]) for h in range(12) for b in range(buckets)}
    e_h, e_b = rng.integers(0, 12, e), rng.integers(0, buckets, e)
    l_h, l_b = rng.integers(0, 12, l_), rng.integers(0, buckets, l_)
    fresh, gone = kernels.count_holders(counts, e_h, e_b, l_h, l_b)
    want = dict(before)
    for h, b in zip(e_h.tolist(), e_b.tolist()):
        want[h, b] += 1
    for h, b in zip(l_h.tolist(), l_b.tolist()):
        want[h, b] = max(want[h, b] - 1, 0)
    assert {(h, b): int(counts[h, b]) for h, b in want} == want
    got_fresh = [(int(e_h[i]), int(e_b[i])) for i in fresh]
    assert len(set(got_fresh)) == len(got_fresh)
    assert set(got_fresh) == {(h, b) for h, b in zip(e_h.tolist(), e_b.tolist()) if before[h, b] == 0 and want[h, b]}
    assert {(int(l_h[i]), int(l_b[i])) for i in gone} == {(h, b) for h, b in zip(l_h.tolist(), l_b.tolist())
                                                         if want[h, b] == 0}


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lists=st.integers(0, 12), longest=st.integers(0, 80))
def test_kth_latest_equals_sorting_each_list(seed, lists, longest):
    """Each list's k-th latest time within its radius (ties in time, lists longer than the
    kernel's first buffer, empty ones) and its oldest entry's, against sorting each list."""
    from knnmon.refills import NEVER

    rng = np.random.default_rng(seed)
    count = rng.integers(0, longest + 1, lists).astype(np.int64)
    start = np.cumsum(count) - count
    t = rng.integers(0, 8, int(count.sum())).astype(np.int64) * 1000  # (many ties)
    within = rng.random(len(t)) < 0.7
    k = rng.integers(1, 12, lists).astype(np.int64)
    kth, oldest = kernels.kth_latest(t, within, start, count, k, NEVER)
    for j in range(lists):
        own = t[start[j]:start[j] + count[j]]
        inside = np.sort(own[within[start[j]:start[j] + count[j]]])[::-1]
        assert kth[j] == (inside[k[j] - 1] if len(inside) >= k[j] else NEVER)
        assert oldest[j] == (own.min() if len(own) else NEVER)


def test_the_kernels_agree_with_the_jit_disabled():
    """The kernel tests here and the worker's merge against the oracle, as plain Python."""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not jit_disabled",
                        str(here / "test_kernels.py"), str(here / "test_worker_merge.py")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout
