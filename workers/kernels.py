"""The worker's compiled kernels (numba): one pass per step of a batch, no Python per pair.

A batch's candidate (object, query) pairs come from the query index (:func:`grid_hits`: the
grid lists' entries equal to each probe key, the superseded ones skipped, pre-tested as found);
then (``docs/concepts.md``, "The worker"; Tsuruoka et al. 2019, §4.4, steps 2-3):

1. :func:`chord_pretest` -- the cheap superset test of ``d(o, q) <= r_q`` on unit vectors
   (:func:`knnmon.geo.chord2_bound`);
2. the exact haversine distance of the pairs that pass, in numpy (:func:`knnmon.geo.haversine_m`:
   every distance knnmon stores comes from that one function, so equal distances compare equal
   bit for bit, whichever code computed them);
3. :func:`merge_topk` -- each touched query's top-k merged with its new pairs within ``r_q``,
   ordered by (distance, object id), with the changed results' entered and left entries;
4. :func:`count_holders` -- how many results of the worker hold each object (per details hash),
   and so which objects' details the write adds and which it deletes
   (:mod:`knnmon.workers.holders`).

Compiled with ``cache=True`` into ``NUMBA_CACHE_DIR`` (:mod:`knnmon.jit`);
:func:`compile_kernels` compiles or loads them once, before a worker's first batch. With
``NUMBA_DISABLE_JIT=1`` they run as plain Python (the tests run both ways).
"""

from __future__ import annotations

import numpy as np

from knnmon.jit import jit as _jit

__all__ = ["chord_pretest", "compile_kernels", "count_holders", "grid_hits", "kth_latest", "merge_topk"]


@_jit
def chord_pretest(ox: np.ndarray, oy: np.ndarray, oz: np.ndarray, obj: np.ndarray, slot: np.ndarray,
                  reach: np.ndarray) -> np.ndarray:
    """The candidate pairs that may lie within their query's kNN radius.

    Parameters
    ----------
    ox, oy, oz
        ``(n,)`` float64: the batch's objects' unit vectors (:func:`knnmon.geo.unit_vectors`).
    obj, slot
        ``(c,)`` int64: the candidate pairs (batch position, query slot).
    reach
        ``(Q, 4)`` float64 per query slot: its unit vector and ``chord2_bound(r_q)`` (``-1`` once
        removed, so nothing passes).

    Returns
    -------
    numpy.ndarray
        ``(p,)`` int64 positions in ``obj``/``slot`` of the pairs with ``2 - 2 o.q <=
        chord2_bound(r_q)``, i.e. ``(o, 1/2).(q, T) >= 1`` (a superset of ``d <= r_q``).
    """
    out, m = np.empty(len(obj), dtype=np.int64), 0
    for i in range(len(obj)):
        o, s = obj[i], slot[i]
        if ox[o] * reach[s, 0] + oy[o] * reach[s, 1] + oz[o] * reach[s, 2] + 0.5 * reach[s, 3] >= 1.0:
            out[m] = i
            m += 1
    return out[:m]


@_jit
def _sorted_search(keys: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """``np.searchsorted(keys, probe)`` for sorted ``probe``: each search gallops from where the
    last one ended (doubling steps, then bisection), so close probes touch few cache lines."""
    out = np.empty(len(probe), dtype=np.int64)
    n = len(keys)
    lo = 0
    for i in range(len(probe)):
        x = probe[i]
        if lo > 0 and keys[lo - 1] >= x:  # (not sorted after all: search from the start)
            lo = 0
        step = 1
        hi = lo
        while hi < n and keys[hi] < x:
            lo = hi + 1
            hi = lo + step
            step *= 2
        hi = min(hi, n)
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo
    return out


@_jit
def grid_hits(probe: np.ndarray, owner: np.ndarray, ukeys: np.ndarray, ustart: np.ndarray, slots: np.ndarray,
              gens: np.ndarray, gen: np.ndarray, ox: np.ndarray, oy: np.ndarray, oz: np.ndarray, reach: np.ndarray,
              test: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """The current entries of one sorted run of grid entries whose key equals a probe.

    Parameters
    ----------
    probe, owner
        ``(m,)`` int64: probe keys (sorted, so consecutive binary searches share cache lines)
        and the batch position of the object each belongs to (unsorted probes are answered too,
        more slowly).
    ukeys, ustart
        The run's distinct keys ``(u,)`` int64 and where each one's entries start ``(u + 1,)``.
    slots, gens
        ``(e,)`` int64 and int32: each entry's query slot and the generation it belongs to.
    gen
        ``(Q,)`` int32: each slot's current generation (an entry of another one is superseded).
    ox, oy, oz, reach, test
        With ``test``, only the pairs that pass :func:`chord_pretest` (arguments as there; most
        fail it: about 94 % of a windowed worker's in stream order, never written out).

    Returns
    -------
    obj, slot, hits
        ``(h,)`` int64: one pair per current entry hit (that passes), in probe order; entries hit.

    Source: the grid inverted lists of Tsuruoka et al. 2019, §4.4 (:mod:`knnmon.workers.query_index`).
    """
    at = _sorted_search(ukeys, probe)
    total = 0
    for i in range(len(probe)):
        if at[i] < len(ukeys) and ukeys[at[i]] == probe[i]:
            total += ustart[at[i] + 1] - ustart[at[i]]
    obj, slot = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
    m = hits = 0
    for i in range(len(probe)):
        u = at[i]
        if u < len(ukeys) and ukeys[u] == probe[i]:
            o = owner[i]
            for e in range(ustart[u], ustart[u + 1]):
                s = slots[e]
                if gens[e] == gen[s]:
                    hits += 1
                    if not test or (ox[o] * reach[s, 0] + oy[o] * reach[s, 1] + oz[o] * reach[s, 2]
                                    + 0.5 * reach[s, 3] >= 1.0):
                        obj[m], slot[m] = o, s
                        m += 1
    return obj[:m], slot[:m], hits


@_jit
def _before(da: float, ka: np.uint64, db: float, kb: np.uint64) -> bool:
    """Entry a orders before entry b: by distance, then by id prefix key."""
    return da < db or (da == db and ka < kb)


@_jit
def _sort_run(md: np.ndarray, mh: np.ndarray, mk: np.ndarray, a: int, b: int) -> bool:
    """Insertion-sort the scratch entries ``a..b-1`` (equal distances) by key; ``True`` if two
    of them share a key (their order needs the ids themselves)."""
    for i in range(a + 1, b):
        h, k = mh[i], mk[i]
        j = i - 1
        while j >= a and mk[j] > k:
            mh[j + 1], mk[j + 1] = mh[j], mk[j]
            j -= 1
        mh[j + 1], mk[j + 1] = h, k
    for i in range(a + 1, b):
        if mk[i] == mk[i - 1]:
            return True
    return False


@_jit
def _straddle(md: np.ndarray, mh: np.ndarray, mk: np.ndarray, n: int, cut: int, hkey: np.ndarray,
              okey: np.ndarray) -> bool:
    """Order by key the run of equal distances across place ``cut`` of the ``n`` merged entries
    (if one straddles it: only such a run decides by id which entries are kept); ``True`` if
    that needs the ids themselves (two keys equal). The keys are read here, for such runs only
    (a handle's from ``hkey``, a new object's from ``okey``): most lists never need them, and
    each is a cache miss."""
    if cut <= 0 or cut >= n or md[cut - 1] != md[cut]:
        return False
    a, b = cut - 1, cut + 1
    while a > 0 and md[a - 1] == md[cut]:
        a -= 1
    while b < n and md[b] == md[cut]:
        b += 1
    for t in range(a, b):
        mk[t] = hkey[mh[t]] if mh[t] >= 0 else okey[-1 - mh[t]]
    return _sort_run(md, mh, mk, a, b)


@_jit
def merge_topk(obj: np.ndarray, slot: np.ndarray, d: np.ndarray, okey: np.ndarray, radius: np.ndarray,
               k: np.ndarray, cap: np.ndarray, top_ptr: np.ndarray, count: np.ndarray, top_d: np.ndarray,
               top_h: np.ndarray, hkey: np.ndarray, n_obj: int):
    """Merge a batch's pairs into the touched queries' top-k lists, in place.

    A query's list is ``top_d`` / ``top_h`` at ``top_ptr[s] .. + cap[s]`` (nearest first, its
    first ``count[s]`` filled; its result is the first ``k[s]``, the rest a window's reserve).
    The pairs within ``r_q`` (``d <= radius[s]``) are grouped by query (a counting sort), and of
    a query's distinct new objects only the ``cap[s]`` nearest and those tied with the last of
    them are sorted and merged with its list by distance (no other can be kept: a query whose
    radius takes in hundreds of a batch's objects costs O(pairs), not a sort of them); a run of equal
    distances across the ``k``-th or the last place is ordered by the objects' id prefix keys
    (:func:`knnmon.encoding.id_prefix_keys`), so the kept set is the exact kNN with ties broken
    by id. Where two such entries share a key, the query is left untouched and returned in
    ``fallback`` (the caller orders it by the ids themselves). A kept new entry's handle is
    written as ``-1 - obj`` (its batch position); the caller replaces it by the handle it assigns
    (at ``e_place``).

    Parameters
    ----------
    obj, slot, d
        ``(p,)`` int64, int64, float64 meters: pairs (batch position, query slot, distance); a
        query sharing several keywords with an object may appear once per keyword.
    okey
        ``(n_obj,)`` uint64: the batch's objects' id prefix keys (only those of objects in
        ``obj`` are read).
    radius, k, cap, top_ptr, count
        Per query slot: ``r_q`` (float64 meters, ``inf`` below ``cap`` entries), ``k``, places
        (``k`` + reserve), the first place, places filled (int64). ``count`` is updated.
    top_d, top_h
        The flat lists (float64 meters, int64 handles; updated).
    hkey
        ``(handles,)`` uint64: the id prefix key of each handle in the lists.
    n_obj
        Objects in the batch.

    Returns
    -------
    tuple of numpy.ndarray
        ``passed`` (int64 scalar array: pairs within ``r_q``, duplicates counted once),
        ``changed`` (sorted slots whose kept list gained an entry), ``in_result`` (sorted slots
        a new entry entered the first ``k`` of), entered ``e_slot``, ``e_obj``, ``e_d``,
        ``e_place`` (grouped by slot in slot order; ``e_place`` the flat place written), left
        ``l_slot``, ``l_h`` (old entries pushed past the last place), ``b_slot``, ``b_h`` (the
        changed lists' results before, their first ``min(count, k)`` handles), and ``fallback``
        with its pairs ``f_slot``, ``f_obj``, ``f_d`` (within ``r_q``, duplicates dropped).

    Source: the per-query top-k update of Tsuruoka et al. 2019, §4.4, for every query of a
    batch in one pass.
    """
    # Pairs within r_q, grouped by slot in a counting sort (stable: each slot's in batch order).
    n_slots = len(radius)
    start = np.zeros(n_slots + 1, dtype=np.int64)
    p = 0
    for i in range(len(obj)):
        if d[i] <= radius[slot[i]]:
            start[slot[i] + 1] += 1
            p += 1
    for s in range(n_slots):
        start[s + 1] += start[s]
    order = np.empty(p, dtype=np.int64)
    fill = start[:n_slots].copy()
    for i in range(len(obj)):
        if d[i] <= radius[slot[i]]:
            order[fill[slot[i]]] = i
            fill[slot[i]] += 1
    groups = np.empty(p, dtype=np.int64)  # the slots with pairs, ascending
    ng = 0
    big = nb = longest = 0  # the longest list; the before arrays' size (sum of min(count, k)); the most pairs
    for s in range(n_slots):
        if start[s + 1] > start[s]:
            groups[ng] = s
            ng += 1
            big = max(big, cap[s])
            nb += min(count[s], k[s])
            longest = max(longest, start[s + 1] - start[s])
    md = np.empty(big + longest, dtype=np.float64)
    mh = np.empty(big + longest, dtype=np.int64)
    mk = np.empty(big + longest, dtype=np.uint64)
    gi_ = np.empty(longest, dtype=np.int64)  # a slot's distinct pairs, in batch order
    gd_ = np.empty(longest, dtype=np.float64)
    si_ = np.empty(longest, dtype=np.int64)  # those that can be kept, nearest first
    seen = np.full(n_obj, -1, dtype=np.int64)
    changed = np.empty(p, dtype=np.int64)
    in_result = np.empty(p, dtype=np.int64)
    e_slot, e_obj, e_place = np.empty(p, np.int64), np.empty(p, np.int64), np.empty(p, np.int64)
    e_d = np.empty(p, np.float64)
    l_slot, l_h = np.empty(p, np.int64), np.empty(p, np.int64)
    b_slot, b_h = np.empty(nb, np.int64), np.empty(nb, np.int64)
    fallback = np.empty(p, np.int64)
    f_slot, f_obj, f_d = np.empty(p, np.int64), np.empty(p, np.int64), np.empty(p, np.float64)
    nc = ni = ne = nl = nbf = nf = nfp = 0
    passed = 0
    for gi in range(ng):
        s = groups[gi]
        a, c, kk, cp = top_ptr[s], count[s], k[s], cap[s]
        m = 0  # distinct objects (one shared keyword or several: the first pair counts)
        for j in range(start[s], start[s + 1]):
            o = obj[order[j]]
            if seen[o] != s:
                seen[o] = s
                gi_[m], gd_[m] = order[j], d[order[j]]
                m += 1
        passed += m
        # Only the cap nearest new pairs and those tied with the last of them can be kept: the
        # rest need no sort (a query whose radius takes in hundreds of a batch's objects).
        cut = np.inf
        if m > cp:
            cut = np.partition(gd_[:m], cp - 1)[cp - 1]
        w = 0
        for j in range(m):
            if gd_[j] <= cut:
                si_[w] = gi_[j]
                w += 1
        by = np.argsort(d[si_[:w]], kind="mergesort")  # (equal distances stay in batch order)
        # Merge the old list (sorted by distance) with the new pairs (sorted by distance).
        n = 0
        i, j = 0, 0
        while i < c or j < w:
            take_old = j >= w or (i < c and top_d[a + i] <= d[si_[by[j]]])
            if take_old:
                h = top_h[a + i]
                if h < 0:  # (a placeholder left unpatched: the outputs are sized for valid lists only)
                    raise ValueError("a top-k list holds an entry without a handle")
                md[n], mh[n] = top_d[a + i], h
                i += 1
            else:
                q = si_[by[j]]
                md[n], mh[n] = d[q], -1 - obj[q]
                j += 1
            n += 1
        # Order by key the runs of equal distance that decide which entries are kept.
        if _straddle(md, mh, mk, n, kk, hkey, okey) or _straddle(md, mh, mk, n, cp, hkey, okey):
            fallback[nf] = s
            nf += 1
            for t in range(m):  # every distinct new pair, those beyond the cut too
                f_slot[nfp], f_obj[nfp], f_d[nfp] = s, obj[gi_[t]], gd_[t]
                nfp += 1
            continue
        kept = min(n, cp)
        gained = False
        into_result = False
        for t in range(kept):
            if mh[t] < 0:
                gained = True
                if t < kk:
                    into_result = True
        if gained:
            changed[nc] = s
            nc += 1
            if into_result:
                in_result[ni] = s
                ni += 1
            for t in range(min(c, kk)):
                b_slot[nbf], b_h[nbf] = s, top_h[a + t]
                nbf += 1
            for t in range(kept):
                if mh[t] < 0:
                    e_slot[ne], e_obj[ne], e_d[ne], e_place[ne] = s, -1 - mh[t], md[t], a + t
                    ne += 1
            for t in range(kept, n):
                if mh[t] >= 0:
                    l_slot[nl], l_h[nl] = s, mh[t]
                    nl += 1
            for t in range(kept):
                top_d[a + t], top_h[a + t] = md[t], mh[t]
            count[s] = kept
    return (np.array([passed], dtype=np.int64), changed[:nc], in_result[:ni], e_slot[:ne], e_obj[:ne], e_d[:ne],
            e_place[:ne], l_slot[:nl], l_h[:nl], b_slot[:nbf], b_h[:nbf], fallback[:nf], f_slot[:nfp],
            f_obj[:nfp], f_d[:nfp])


@_jit
def count_holders(counts: np.ndarray, e_h: np.ndarray, e_b: np.ndarray, l_h: np.ndarray, l_b: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Count one write's holders: every entry first, then every departure, so an object leaving
    one result and entering another in the same write stays held.

    Parameters
    ----------
    counts
        ``(handles, buckets)`` int32, updated in place: how many results of the worker hold
        each object handle, per details hash (bucket).
    e_h, e_b
        ``(e,)`` int64: the handles that entered a result and the bucket of that result.
    l_h, l_b
        ``(l,)`` int64: the same for the handles that left one.

    Returns
    -------
    fresh, gone
        ``(f,)`` int64 positions in ``e_h`` of the (handle, bucket)s no result held before and
        one holds after (each once: their details are written), and ``(g,)`` int64 positions in
        ``l_h`` of those no result holds after (their details are deleted). A departure of an
        object not held leaves its count at 0 and counts as gone.
    """
    fresh = np.empty(len(e_h), dtype=np.int64)
    nf = 0
    for i in range(len(e_h)):
        c = counts[e_h[i], e_b[i]]
        if c == 0:
            fresh[nf] = i
            nf += 1
        counts[e_h[i], e_b[i]] = c + 1
    gone = np.empty(len(l_h), dtype=np.int64)
    ng = 0
    for i in range(len(l_h)):
        c = counts[l_h[i], l_b[i]] - 1
        if c <= 0:
            c = 0
            gone[ng] = i
            ng += 1
        counts[l_h[i], l_b[i]] = c
    kept = 0
    for j in range(nf):
        i = fresh[j]
        if counts[e_h[i], e_b[i]] > 0:
            fresh[kept] = i
            kept += 1
    return fresh[:kept], gone[:ng]


@_jit
def kth_latest(t: np.ndarray, within: np.ndarray, start: np.ndarray, count: np.ndarray, k: np.ndarray,
               never: int) -> tuple[np.ndarray, np.ndarray]:
    """Each list's ``k``-th latest time among its entries within the kNN radius (``never`` with
    fewer) and its oldest entry's time (``never`` when empty): ``(m,)`` int64 each, epoch ms
    (:meth:`~knnmon.workers.window_lists.WindowLists.deadlines`). ``t``, ``within``: ``(E,)``
    int64 times and bool of every entry, list after list; ``start``, ``count``, ``k``: ``(m,)``
    int64 per list. One pass; a list's times within the radius are kept in decreasing order by
    insertion (``k + reserve`` at most: no allocation per list)."""
    m = len(start)
    kth, oldest = np.full(m, never, dtype=np.int64), np.full(m, never, dtype=np.int64)
    buf = np.empty(64, dtype=np.int64)
    for j in range(m):
        a, n = start[j], count[j]
        if n > len(buf):
            buf = np.empty(2 * n, dtype=np.int64)
        w, old = 0, never
        for i in range(a, a + n):
            x = t[i]
            if x < old:
                old = x
            if within[i]:
                p = w
                while p > 0 and buf[p - 1] < x:
                    buf[p] = buf[p - 1]
                    p -= 1
                buf[p] = x
                w += 1
        oldest[j] = old
        if w >= k[j]:
            kth[j] = buf[k[j] - 1]
    return kth, oldest


def compile_kernels() -> None:
    """Compile (or load from the cache) every kernel for the dtypes the worker passes, so that
    no batch pays for compilation."""
    i0, f0, u0 = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.uint64)
    g0, r0 = np.zeros(0, np.int32), np.zeros((0, 4))
    chord_pretest(f0, f0, f0, i0, i0, r0)
    grid_hits(i0, i0, i0, np.zeros(1, np.int64), i0, g0, g0, f0, f0, f0, r0, True)
    merge_topk(i0, i0, f0, u0, f0, i0, i0, i0, i0, f0, i0, u0, 0)
    count_holders(np.zeros((0, 1), np.int32), i0, i0, i0, i0)
    kth_latest(i0, np.zeros(0, np.bool_), i0, i0, i0, 0)
