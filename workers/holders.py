"""Which objects' details a worker's writes add and delete: per object handle, how many of the
worker's results hold it, in an int32 array (no Python object per held object).

An object's details (``lon lat t keywords``) are in the worker's details hash while at least one
of its results holds it (:mod:`knnmon.workers.result_writer`, 3.). In a Redis Cluster the worker
has one details hash per master (on the master of the result's key), so the counts are per
(handle, bucket): bucket 0 is the standalone Redis's one hash, else one bucket per master name.
The worker counts every write's entered and left handles here before the write
(:func:`knnmon.workers.kernels.count_holders`), and the write carries the result:
:attr:`knnmon.batch.BatchChanges.details`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.batch import ObjectColumns, ObjectInfo
from knnmon.workers import kernels

__all__ = ["Details", "Holders", "Texts", "texts_of"]

#: Details hash key -> (HSET arguments: id, text, id, text, ...; HDEL ids).
Details = dict[str, tuple[list[str], list[str]]]
#: Object ids -> their details' texts (:meth:`knnmon.batch.ObjectInfo.to_text`), ``None`` where unknown.
Texts = Callable[[list[str]], Sequence[str | None]]


def texts_of(objects: Mapping[str, ObjectInfo]) -> Texts:
    """:data:`Texts` from ``objects`` (:class:`~knnmon.batch.ObjectColumns` make them in
    bulk)."""
    if isinstance(objects, ObjectColumns):
        return objects.texts

    def texts(oids: list[str]) -> list[str | None]:
        get = objects.get
        return [None if (info := get(oid)) is None else info.to_text() for oid in oids]

    return texts


class Holders:
    """Holder counts per object handle and details hash (module docstring).

    Parameters
    ----------
    key_of
        The details hash's key from a bucket name (``ResultWriter.bucket_key``).
    bucket_of
        A result's bucket name from its query id, a master's name in a cluster
        (``ResultWriter.bucket``); ``None``: one bucket, ``""`` (a standalone Redis).
    """

    def __init__(self, key_of: Callable[[str], str], bucket_of: Callable[[str], str] | None = None) -> None:
        self._key_of, self._bucket_of = key_of, bucket_of
        self.names: list[str] = [""] if bucket_of is None else []
        self._index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        #: ``(>= handles, buckets)`` int32, capacity-doubled by rows.
        self.counts = np.zeros((0, max(len(self.names), 1)), dtype=np.int32)

    @property
    def single(self) -> bool:
        """One details hash (a standalone Redis): every result's bucket is 0."""
        return self._bucket_of is None

    def buckets(self, qids: Sequence[str]) -> np.ndarray:
        """``(len(qids),)`` int64: the bucket of each query's result."""
        if self._bucket_of is None:
            return np.zeros(len(qids), dtype=np.int64)
        out = np.empty(len(qids), dtype=np.int64)
        for j, qid in enumerate(qids):
            name = self._bucket_of(qid)
            b = self._index.get(name)
            if b is None:
                b = self._index[name] = len(self.names)
                self.names.append(name)
            out[j] = b
        if len(self.names) > self.counts.shape[1]:
            grown = np.zeros((len(self.counts), len(self.names)), dtype=np.int32)
            grown[:, :self.counts.shape[1]] = self.counts
            self.counts = grown
        return out

    def change(self, e_h: np.ndarray, e_b: np.ndarray, l_h: np.ndarray, l_b: np.ndarray,
               names: Callable[[np.ndarray], list[str]], texts: Texts) -> Details:
        """Count one write's entered handles ``e_h`` (results of buckets ``e_b``) and left ones
        ``l_h`` (``l_b``), all ``(x,)`` int64; the details to write: the text (``texts``;
        ``None``: unknown, not written) of the objects no result held there before, the ids of
        those none holds after, per details hash key. ``names``: the ids of handles."""
        e_h, e_b = np.asarray(e_h, dtype=np.int64), np.asarray(e_b, dtype=np.int64)
        l_h, l_b = np.asarray(l_h, dtype=np.int64), np.asarray(l_b, dtype=np.int64)
        top = max(int(e_h.max(initial=-1)), int(l_h.max(initial=-1))) + 1
        self.counts = with_capacity(self.counts, top)
        fresh, gone = kernels.count_holders(self.counts, e_h, e_b, l_h, l_b)
        out: Details = {}
        new = names(e_h[fresh])
        for b, oid, value in zip(e_b[fresh].tolist(), new, texts(new)):
            if value is not None:
                out.setdefault(b, ([], []))[0].extend((oid, value))
        for b, oid in zip(l_b[gone].tolist(), names(l_h[gone])):
            out.setdefault(b, ([], []))[1].append(oid)
        return {self._key_of(self.names[b]): hs_hd for b, hs_hd in out.items()}

    def held(self) -> np.ndarray:
        """``(h,)`` int64: the sorted handles some result holds."""
        return np.flatnonzero(self.counts.any(axis=1))

    def by_handle(self) -> np.ndarray:
        """``(handles,)`` int64: the results holding each handle, all buckets together."""
        return self.counts.sum(axis=1, dtype=np.int64)

    def renumber(self, used: np.ndarray) -> None:
        """Keep the rows of the sorted handles ``used`` only, renumbered ``0..len(used)-1`` (as
        :meth:`~knnmon.workers.object_handles.ObjectHandles.compact` does); ``used`` must
        include every held handle."""
        used = np.asarray(used, dtype=np.int64)
        self.counts = with_capacity(self.counts, int(used.max(initial=-1)) + 1)[used]
