"""Making Redis hold what a worker rebuilt over the live objects holds (a window's revival).

With a window a lost worker is rebuilt over the coordinator's live objects
(:func:`~knnmon.coordinator.recovery.revival.revive` with ``live``): each query's ``k + reserve``
nearest live matches. What Redis holds of that worker may be older: a worker lost during a
batch (its expiry, its refills, its objects) wrote none of the batch, or all of it, or part of
it. :func:`repair_worker` makes Redis equal the rebuilt state in **one** atomic script call of
the worker's own writer (:class:`~knnmon.workers.result_writer.ResultWriter`), at the change
feed version of the batch it completes:

- each result whose members differ: the objects that entered (with their distances) and those
  that left, one feed line per changed result, as a batch's changes are written;
- the worker's details hashes (``knn:objects:{worker}``, one per master in a cluster): the
  details of every object a rebuilt result holds that the hash lacks are set, and every object
  the hash holds that no rebuilt result holds any more is deleted -- so the hash again holds
  exactly the objects of the worker's results, as the worker's holder counts will say when it
  loads with ``write=False``;
- the worker's idempotency marker: ``tag``, the last batch whose state Redis now holds.

Nothing is written when Redis holds the rebuilt state already (a worker lost between batches).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from knnmon.batch import BatchChanges, KnnColumns, ObjectColumns
from knnmon.connection import with_retries

__all__ = ["SAME_DISTANCE_M", "Repair", "read_details", "repair_worker"]

#: Two distances of one object closer than this (meters) are the same: the coordinator's search and
#: the worker's kernels may round the same haversine differently; an id published again as a new
#: object elsewhere moves by far more.
SAME_DISTANCE_M = 1e-6


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_worker` wrote: changed ``results``, details ``set`` and ``deleted``."""

    results: int = 0
    set: int = 0
    deleted: int = 0


def _details_texts(writer, chunk: int = 10_000) -> dict[str, dict[str, str]]:
    """Each of the writer's worker's details hashes (one per master in a cluster), read whole
    (HSCAN: bounded replies): hash key -> {object id: details text}."""
    names = writer.masters.names if writer.masters is not None else [""]
    return {key: with_retries(lambda key=key: dict(writer.client.hscan_iter(key, count=chunk)),
                              "reading a worker's object details", writer.url)
            for key in (writer.bucket_key(name) for name in names)}


def read_details(redis_url: str, namespace: str, worker: int) -> dict[str, dict[str, str]]:
    """Worker ``worker``'s details hashes, read whole: hash key -> {object id: details text}.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    from knnmon.workers.result_writer import ResultWriter

    writer = ResultWriter(redis_url, namespace, worker)
    try:
        return _details_texts(writer)
    finally:
        writer.close()


def repair_worker(redis_url: str, namespace: str, worker: int, qids: Sequence[str],
                  stored: Sequence[Sequence[tuple[str, float]]], rebuilt: KnnColumns, k: np.ndarray,
                  objects: ObjectColumns, *, version: int, tag: int,
                  held: Mapping[str, Collection[str]] | None = None) -> Repair:
    """Make Redis hold worker ``worker``'s rebuilt results (module docstring).

    Parameters
    ----------
    qids
        The ``m`` queries the rebuilt worker holds.
    stored
        ``m`` results as Redis holds them: ``(object id, distance m)``, nearest first.
    rebuilt
        The ``m`` rebuilt lists, nearest first, ties by id (with a reserve, longer than ``k``).
    k
        ``(m,)`` int64: each query's ``k`` (its result is its list's first ``k``).
    objects
        Details of every object in ``rebuilt``.
    version
        The change feed version of the repair: the batch the rebuilt state completes, plus one.
    tag
        The marker's batch number: the last batch whose state Redis holds after the repair.
    held
        The object ids each details hash holds, if the caller read them (:func:`read_details`);
        read here otherwise.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    from knnmon.workers.result_writer import ResultWriter

    k = np.asarray(k, dtype=np.int64)
    writer = ResultWriter(redis_url, namespace, worker)
    try:
        diffs, wanted = [], {}
        for j, (qid, old) in enumerate(zip(qids, stored)):
            new = rebuilt[j][:int(k[j])]
            wanted.setdefault(writer.details_key(qid), set()).update(o for o, _ in new)
            before = {o: float(d) for o, d in old}
            entered = [(o, d) for o, d in new if o not in before or abs(before[o] - d) > SAME_DISTANCE_M]
            kept = {o for o, _ in new}
            left = [o for o in before if o not in kept]
            if entered or left:
                diffs.append((qid, entered, left))
        details = {}
        n_set = n_deleted = 0
        for key, ids in (held if held is not None else _details_texts(writer)).items():
            want, ids = wanted.get(key, set()), set(ids)
            fresh, gone = sorted(want - ids), sorted(ids - want)
            if not fresh and not gone:
                continue
            texts = objects.texts(fresh)
            hs = [x for oid, text in zip(fresh, texts) if text is not None for x in (oid, text)]
            details[key] = (hs, gone)
            n_set, n_deleted = n_set + len(hs) // 2, n_deleted + len(gone)
        if diffs or details:
            changes = BatchChanges.from_diffs(diffs, objects, version)
            writer.write_batch(tag, replace(changes, details=details))
        return Repair(len(diffs), n_set, n_deleted)
    finally:
        writer.close()
