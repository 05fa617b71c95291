"""The brute-force kNN oracle: exact haversine kNN by the semantics of ``docs/concepts.md``.

Every correctness test compares knnmon's results with this. It scans, for each query, every
object sharing at least one keyword (Boolean OR), computes haversine distances and ranks by
``(distance m, object id)``: no spatial pruning, nothing to get wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from knnmon.geo import haversine_m

__all__ = ["BruteForceKnn"]


class BruteForceKnn:
    """Exact kNN over a fixed set of objects, through keyword posting lists.

    Parameters
    ----------
    objects
        pyarrow Table with ``id`` (string), ``lon``, ``lat`` (float64 degrees), ``keywords``
        (list<string>). Object ids must be unique.

    Examples
    --------
    >>> t = pa.table({"id": ["a", "b", "c"], "lon": [0.0, 0.001, 0.002], "lat": [0.0, 0.0, 0.0],
    ...               "keywords": [["tea"], ["coffee"], ["coffee", "tea"]]})
    >>> [(i, round(d, 1)) for i, d in BruteForceKnn(t).knn(0.0, 0.0, ["coffee"], k=5)]
    [('b', 111.2), ('c', 222.4)]
    """

    def __init__(self, objects: pa.Table) -> None:
        self.ids = np.asarray(objects.column("id").to_pylist(), dtype=object)
        self.lon = objects.column("lon").to_numpy()
        self.lat = objects.column("lat").to_numpy()
        kw = objects.column("keywords").combine_chunks()
        words = kw.flatten()
        owner = pc.list_parent_indices(kw).to_numpy()
        codes = pc.dictionary_encode(words)
        dictionary = codes.dictionary.to_pylist()
        idx = codes.indices.to_numpy()
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(len(dictionary) + 1))
        sorted_owner = owner[order]
        self._postings = {w: sorted_owner[bounds[i]:bounds[i + 1]] for i, w in enumerate(dictionary)}
        # Rank of each id in lexicographic order, for (distance, id) tie-breaking.
        self._id_rank = np.empty(len(self.ids), dtype=np.int64)
        self._id_rank[np.argsort(self.ids, kind="stable")] = np.arange(len(self.ids))

    def matching(self, keywords: Iterable[str]) -> np.ndarray:
        """Indices (int64, sorted) of objects sharing at least one of ``keywords``."""
        lists = [self._postings[w] for w in set(keywords) if w in self._postings]
        if not lists:
            return np.empty(0, dtype=np.int64)
        if len(lists) == 1:
            return lists[0]
        hit = np.zeros(len(self.ids), dtype=bool)  # a union without sorting (np.unique sorted)
        for p in lists:
            hit[p] = True
        return np.flatnonzero(hit)

    def knn(self, lon: float, lat: float, keywords: Iterable[str], k: int) -> list[tuple[str, float]]:
        """The ``k`` nearest matching objects as ``[(object id, distance m), ...]``, nearest first.

        Ties at equal distance are broken by smaller object id; fewer than ``k`` matching
        objects returns all of them.
        """
        cand = self.matching(keywords)
        d = haversine_m(lon, lat, self.lon[cand], self.lat[cand])
        if len(d) > k:  # every distance is computed; only those up to the k-th (ties included) are sorted
            keep = d <= np.partition(d, k - 1)[k - 1]
            cand, d = cand[keep], d[keep]
        top = np.lexsort((self._id_rank[cand], d))[:k]
        return [(str(self.ids[cand[i]]), float(d[i])) for i in top]
