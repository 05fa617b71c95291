"""Exact spatial-keyword kNN over a fixed set of objects: per-keyword 3-D k-d trees.

Used for a query's initial kNN (a query registered after objects have arrived starts from its
exact kNN) and, by the planner, for the exact kNN radius ``r_q`` over the initial objects.

Objects are indexed as points on the unit sphere (ECEF unit vectors). The chord distance between
unit vectors ranks exactly like great-circle distance, so a Euclidean 3-D nearest-neighbour search
is exact on the sphere: no pole or antimeridian special cases (``docs/concepts.md``, "Geographic hint").
Each keyword's posting list is ordered into its own k-d tree on first use
(:mod:`~knnmon.coordinator.runtime.keyword_kd`: compiled, in place, 49 bytes per entry: the split
axis and the node boxes). A query with several keywords (Boolean OR) merges its keywords'
candidates. The final ranking is by ``(haversine distance m, object id)``. Each tree is asked for
``k + margin`` neighbours and every entry tied with the last of them, so floating-point near-ties
between chord and haversine order cannot push a true top-k object out.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.arrays import runs
from knnmon.coordinator.runtime.keyword_kd import compile_kd, kd_build, kd_knn, kd_refit
from knnmon.coordinator.runtime.nearest_first import compile_ranking, nearest_first
from knnmon.encoding import id_prefix_keys, keyword_codes
from knnmon.geo import chord2_bound, haversine_m, unit_vectors
from knnmon.heap import give_back

__all__ = ["IdColumn", "ObjectIndex", "morton_codes"]

#: Extra neighbours asked of each per-keyword tree beyond ``k`` (near-tie safety).
TIE_MARGIN = 2


class IdColumn:
    """The objects' ids as one Arrow string array (about 4 bytes per id beyond its characters,
    where a Python string costs ~50): ``ids[i]`` is a ``str``, ``ids[rows]`` an object array."""

    def __init__(self, ids: pa.Array) -> None:
        self.array = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, rows):
        if isinstance(rows, (int, np.integer)):
            return self.array[int(rows)].as_py()
        rows = np.asarray(rows, dtype=np.int64)
        return np.asarray(self.array.take(pa.array(rows)).to_pylist(), dtype=object)


#: Searches (query, keyword pairs) from which one call is split over two threads.
SPLIT_SEARCHES = 2_000
_SECOND: ThreadPoolExecutor | None = None


def _second_thread() -> ThreadPoolExecutor:
    """The thread that searches the second half of a large call (started on first use)."""
    global _SECOND
    if _SECOND is None:
        _SECOND = ThreadPoolExecutor(1, thread_name_prefix="knnmon-kd")
    return _SECOND


#: The index and queries forked children work on (set only while forking).
_FORKED: tuple | None = None


def _knn_forked(share: np.ndarray):
    global _SECOND
    _SECOND = None  # a forked child has none of its parent's threads
    index, lon, lat, keywords, k = _FORKED
    return index.knn_v(lon[share], lat[share], keywords.take(pa.array(share)), k[share])


def morton_codes(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Z-order (Morton) codes of points on a 65,536 x 65,536 lon/lat lattice: ``(m,)`` uint64."""

    def spread(v: np.ndarray) -> np.ndarray:
        for shift, mask in ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
                            (2, 0x3333333333333333), (1, 0x5555555555555555)):
            v = (v | (v << np.uint64(shift))) & np.uint64(mask)
        return v

    x = np.clip((np.asarray(lon) + 180.0) / 360.0 * 65535, 0, 65535).astype(np.uint64)
    y = np.clip((np.asarray(lat) + 90.0) / 180.0 * 65535, 0, 65535).astype(np.uint64)
    return spread(x) | (spread(y) << np.uint64(1))


#: Expired objects per box of :meth:`ObjectIndex.refit` (neighbours in Morton order).
REFIT_GROUP = 32


class ObjectIndex:
    """Per-keyword k-d trees over objects for exact batched kNN.

    Parameters
    ----------
    objects
        pyarrow Table with ``id`` (string, unique), ``lon``, ``lat`` (float64 degrees),
        ``keywords`` (list<string>).

    Examples
    --------
    >>> t = pa.table({"id": ["a", "b", "c"], "lon": [0.0, 0.001, 0.002], "lat": [0.0, 0.0, 0.0],
    ...               "keywords": [["tea"], ["coffee"], ["coffee", "tea"]]})
    >>> idx, counts, dist = ObjectIndex(t).knn_v([0.0], [0.0], [["coffee"]], [1])
    >>> ObjectIndex(t).ids[idx].tolist(), counts.tolist(), dist.round(1).tolist()
    (['b'], [1], [111.2])
    """

    def __init__(self, objects: pa.Table) -> None:
        self.ids = IdColumn(objects.column("id"))
        self.lon = objects.column("lon").to_numpy()
        self.lat = objects.column("lat").to_numpy()
        kw = objects.column("keywords").combine_chunks()
        owner = pc.list_parent_indices(kw).to_numpy().astype(np.int32)
        codes = pc.dictionary_encode(kw.flatten())
        self._vocab_array = codes.dictionary
        self.n_keywords = len(codes.dictionary)  # (no dict of Python strings: ~120 bytes per keyword)
        code = codes.indices.to_numpy()
        order = np.argsort(code, kind="stable")
        self._post_ptr = np.searchsorted(code[order], np.arange(self.n_keywords + 1)).astype(np.int64)
        self._post = owner[order]  # int32: object rows, grouped by keyword code
        offsets = kw.offsets.to_numpy().astype(np.int64)
        self._obj_ptr = offsets - offsets[0]  # each object's keyword codes, for a refit
        self._obj_codes = code.astype(np.int32)
        del owner, code, order, codes
        self._kd: tuple[np.ndarray, ...] | None = None  # xyz, rows, dims, box, built
        self._kd_lock = threading.Lock()  # (a tree is built by one thread: a search's or build_trees')
        compile_ranking()
        compile_kd()  # (loaded from numba's cache after the first time: no search pays for it)
        rank = np.empty(len(self.ids), dtype=np.int32)  # each object's place in id order (ties by id)
        rank[pc.sort_indices(self.ids.array).to_numpy()] = np.arange(len(self.ids), dtype=np.int32)
        self._id_rank = rank
        self._id_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def id_keys(self) -> np.ndarray:
        """``(n,)`` uint64: the objects' ids' order-preserving prefix keys
        (:func:`~knnmon.encoding.id_prefix_keys`), made on first use (8 bytes per object)."""
        if self._id_keys is None:
            self._id_keys = id_prefix_keys(self.ids.array)
        return self._id_keys

    @property
    def vocabulary(self) -> list[str]:
        """The objects' keywords, by code."""
        return self._vocab_array.to_pylist()

    @property
    def trees_built(self) -> int:
        """How many keywords' trees are built."""
        return 0 if self._kd is None else int(self._kd[4].sum())

    def _trees_for(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The objects' unit vectors ``(n, 3)``, the posting lists ``(E,)`` int32, split axes
        ``(E,)`` int8 and node boxes ``(E, 6)`` float64
        (:mod:`~knnmon.coordinator.runtime.keyword_kd`), with the trees of ``codes`` built."""
        with self._kd_lock:
            if self._kd is None:
                self._kd = (unit_vectors(self.lon, self.lat), self._post.copy(),
                            np.zeros(len(self._post), dtype=np.int8), np.zeros((len(self._post), 6)),
                            np.zeros(self.n_keywords, dtype=bool))
            xyz, rows, dims, box, built = self._kd
            new = np.unique(np.asarray(codes, dtype=np.int64))
            new = new[~built[new]]
            if len(new):
                kd_build(xyz, rows, dims, box, self._post_ptr, new)
                built[new] = True
        return xyz, rows, dims, box

    def refit(self, alive: np.ndarray, expired: np.ndarray) -> tuple[int, int]:
        """Shrink the built trees' node boxes to the live objects (``alive``: ``(n,)`` bool),
        visiting the nodes around ``expired`` (rows, int64: the objects expired since the last
        fit, taken :data:`REFIT_GROUP` at a time in Morton order), so that a search skips the
        space they held (:func:`~knnmon.coordinator.runtime.keyword_kd.kd_refit`; safe beside a
        search). Returns the nodes refitted and those of them it left empty."""
        if self._kd is None or not len(expired):
            return 0, 0
        xyz, rows, _, box, built = self._kd
        expired = np.asarray(expired, dtype=np.int64)
        expired = expired[np.argsort(morton_codes(self.lon[expired], self.lat[expired]), kind="stable")]
        gone, starts = xyz[expired], np.arange(0, len(expired), REFIT_GROUP)
        a, b = self._obj_ptr[expired], self._obj_ptr[expired + 1]  # their keyword codes, group by group
        codes = self._obj_codes[runs(a, b - a)].astype(np.int64)
        group_ptr = np.concatenate([[0], np.cumsum(b - a)])[np.append(starts, len(expired))]
        return kd_refit(xyz, rows, box, self._post_ptr, built, np.ascontiguousarray(alive, dtype=bool),
                        np.minimum.reduceat(gone, starts, axis=0), np.maximum.reduceat(gone, starts, axis=0),
                        group_ptr, codes)

    def build_trees(self, postings: int | None = None) -> None:
        """Build every keyword's tree now (a window's part built off the search's path, so that
        no search pays for it). ``postings``: build keywords of about this many (object,
        keyword) pairs at a time, so that a search on another thread waits for one step at most
        (``None``: all at once)."""
        total = int(self._post_ptr[-1])
        step = postings or max(total, 1)
        ends = np.searchsorted(self._post_ptr, np.arange(step, total, step))
        edges = np.unique(np.concatenate([[0], ends, [self.n_keywords]]))
        for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
            self._trees_for(np.arange(a, b, dtype=np.int64))

    def drop_trees(self) -> None:
        """Forget every keyword's tree (built again on use), and the objects' unit vectors: after
        a start-up's search of every query, most of them serve nothing until a registration asks
        for their keyword."""
        with self._kd_lock:
            self._kd = None
        give_back()

    def keyword_pairs(self, keywords) -> tuple[np.ndarray, np.ndarray]:
        """(query index, keyword code) pairs of a batch, unknown keywords left out.

        ``keywords`` is a pyarrow list<string> array (fast path) or a sequence of iterables of
        strings. Returns two ``(p,)`` int64 arrays; a keyword repeated in a query counts once.
        """
        if not isinstance(keywords, (pa.Array, pa.ChunkedArray)):
            keywords = pa.array([sorted(set(kws)) for kws in keywords], type=pa.list_(pa.string()))
        owner, code = keyword_codes(keywords, self._vocab_array)
        known = code >= 0
        q, c = owner[known], code[known]
        key = np.unique(q * (self.n_keywords + 1) + c)
        return key // (self.n_keywords + 1), key % (self.n_keywords + 1)

    def _search(self, pq_: np.ndarray, pc_: np.ndarray, lon: np.ndarray, lat: np.ndarray, k: np.ndarray,
                q_xyz: np.ndarray, alive: np.ndarray | None = None,
                bound_m: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Candidate (query, object) pairs of the (query, keyword code) pairs ``pq_``, ``pc_``:
        each query's ``k + TIE_MARGIN`` nearest in the keyword's tree, and the ties with the last
        of them (:func:`~knnmon.coordinator.runtime.keyword_kd.kd_knn`); with ``alive`` (``(n,)``
        bool over the objects) only live objects count; with ``bound_m`` (``(m,)`` meters) only
        objects within it of their query. The searches run by keyword, nearby queries next to
        each other (they walk the same nodes)."""
        if not len(pq_):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        order = np.lexsort((morton_codes(lon[pq_], lat[pq_]), pc_))
        pq_, pc_ = pq_[order], pc_[order]
        xyz, rows, dims, box = self._trees_for(pc_)  # (built before any thread searches them)
        live = np.zeros(0, dtype=bool) if alive is None else np.ascontiguousarray(alive, dtype=bool)
        bound = np.full(len(pq_), np.inf) if bound_m is None else chord2_bound(bound_m)[pq_]
        want, q = k[pq_] + TIE_MARGIN, np.ascontiguousarray(q_xyz[pq_])

        def search(s: slice) -> tuple[np.ndarray, np.ndarray]:
            return kd_knn(xyz, rows, dims, box, self._post_ptr, live, pc_[s], q[s], want[s], bound[s])

        if len(pq_) < SPLIT_SEARCHES:
            counts, found = search(slice(None))
        else:  # two halves at once: the kernel releases the GIL
            half = len(pq_) // 2
            other = _second_thread().submit(search, slice(half, None))
            (c0, f0), (c1, f1) = search(slice(0, half)), other.result()
            counts, found = np.concatenate([c0, c1]), np.concatenate([f0, f1])
        return np.repeat(pq_, counts), found

    def knn_v(self, lon, lat, keywords, k, *, processes: int = 1, alive: np.ndarray | None = None,
              bound_m: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact kNN of many queries at once.

        Parameters
        ----------
        lon, lat
            ``(m,)`` float64 degrees.
        keywords
            ``m`` iterables of keyword strings (Boolean OR within a query), or a pyarrow
            list<string> array of length ``m`` (faster).
        k
            ``(m,)`` int, each ``>= 1``.
        processes
            Share the queries among this many processes (forked; see :meth:`_knn_parallel`).
            Used only for batches of 20,000 queries or more.
        alive
            ``(n,)`` bool over the indexed objects: search only these (a window's live objects);
            default: all. Not with ``processes > 1``.
        bound_m
            ``(m,)`` float64 meters: only objects within this of their query count (the
            ``k``-th distance over other objects already searched: nothing beyond it can be
            among the nearest); default: no bound. Not with ``processes > 1``.

        Returns
        -------
        idx : ``(sum(counts),)`` int64
            Object indices (rows of ``objects``; ``self.ids[idx]`` are the ids), query by query,
            nearest first, ties by smaller object id.
        counts : ``(m,)`` int64
            Results per query: ``min(k, matching objects)``.
        dist_m : ``(sum(counts),)`` float64
            Haversine distances in meters, aligned with ``idx``.
        """
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        k = np.asarray(k, dtype=np.int64)
        m = len(lon)
        if processes > 1 and m >= 20_000 and alive is None and bound_m is None:
            return self._knn_parallel(lon, lat, keywords, k, processes)
        q_xyz = unit_vectors(lon, lat)
        pq_, pc_ = self.keyword_pairs(keywords)
        fq, fo = self._search(pq_, pc_, lon, lat, k, q_xyz, alive, bound_m)
        d = haversine_m(lon[fq], lat[fq], self.lon[fo], self.lat[fo])
        # Nearest first, ties by id (exact ranks), an object found through two keywords once.
        take, counts, _ = nearest_first(fq, d, self._id_rank[fo].astype(np.uint64), fo, k)
        return fo[take], counts, d[take]

    def _knn_parallel(self, lon, lat, keywords, k, processes: int):
        """:meth:`knn_v` with the queries cut into ``processes`` spatially coherent shares.

        This process builds the trees every share needs and answers one share, forked children
        the others; a child inherits the index (copy-on-write), so only results are pickled.
        Call it before any threads are started in this process (Ray, Spark): fork copies only
        the calling thread.
        """
        global _FORKED
        if not isinstance(keywords, (pa.Array, pa.ChunkedArray)):
            keywords = pa.array([sorted(set(kws)) for kws in keywords], type=pa.list_(pa.string()))
        shares = np.array_split(np.argsort(morton_codes(lon, lat), kind="stable"), processes)
        self._trees_for(self.keyword_pairs(keywords)[1])
        _FORKED = (self, lon, lat, keywords, k)
        try:
            with multiprocessing.get_context("fork").Pool(processes - 1) as pool:
                pending = pool.map_async(_knn_forked, shares[1:], chunksize=1)
                results = [_knn_forked(shares[0])] + pending.get()
        finally:
            _FORKED = None
        # Reassemble in the callers' query order.
        order = np.concatenate(shares)
        counts_cat = np.concatenate([r[1] for r in results])
        idx_cat = np.concatenate([r[0] for r in results])
        dist_cat = np.concatenate([r[2] for r in results])
        counts = np.empty(len(lon), dtype=np.int64)
        counts[order] = counts_cat
        start = np.empty(len(lon), dtype=np.int64)
        start[order] = np.cumsum(counts_cat) - counts_cat
        src = runs(start, counts)
        return idx_cat[src], counts, dist_cat[src]

    def kth_distance_m(self, lon, lat, keywords, k, *, processes: int = 1) -> np.ndarray:
        """The kNN radius ``r_q`` of each query: ``(m,)`` float64 meters, ``inf`` if fewer than k match.

        Arguments as :meth:`knn_v`.
        """
        idx, counts, dist = self.knn_v(lon, lat, keywords, k, processes=processes)
        k = np.asarray(k, dtype=np.int64)
        r = np.full(len(counts), np.inf)
        full = counts >= k
        ends = np.cumsum(counts) - 1
        r[full] = dist[ends[full]]
        return r
