"""The change feed's format (``knn:changes``): one stream entry per write of one worker.

An entry has two fields:

- ``version``: the entries of one stream batch carry one version, each later batch a larger one
  (a batch numbered ``b`` writes ``b + 1``); a registration or an unregister between batches
  carries the number of batches applied so far. Numbers continue above the largest version
  written across restarts, and a service's start takes one for the repairs of its recovery (a
  fresh service's registrations carry 2, its first batch 3). So a query's changes come in
  non-decreasing versions, and only an unregister shares one (with the batch before it, or the
  registration after it);
- ``changes``: one line per changed query, ``qid TAB entered TAB left``, the ids space
  separated (ids hold no whitespace: :func:`knnmon.limits.parse_id`).

A registration's line enters its whole initial result, an unregister's leaves its whole result,
so applying the feed from the start reproduces every result's members. The stream keeps about
the last 5 minutes of changes, and at most about a million
(:data:`~knnmon.workers.result_writer.CHANGES_KEEP_MS`, ``CHANGES_MAXLEN``): a reader that falls
further behind (its last entry id older than the stream's first) reads the results
(``knn:result:{qid}``) again and follows the feed from the entry it read them at. Read it with
:meth:`knnmon.client.KnnClient.changes` or, from any client, ``XRANGE knn:changes`` and split
the lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["feed_text", "parse_entry"]


def feed_text(qids: Sequence[str], n_entered: Sequence[int], entered: Sequence[str], n_left: Sequence[int],
              left: Sequence[str]) -> str:
    """The ``changes`` field of changes flattened per query (as
    :class:`~knnmon.batch.BatchChanges` holds them): query ``qids[j]`` gained the next
    ``n_entered[j]`` ids of ``entered`` and lost the next ``n_left[j]`` of ``left``."""
    lines, ei, li = [], 0, 0
    for qid, ne, nl in zip(qids, n_entered, n_left):
        lines.append(f"{qid}\t{' '.join(entered[ei:ei + ne])}\t{' '.join(left[li:li + nl])}")
        ei, li = ei + ne, li + nl
    return "\n".join(lines)


def parse_entry(fields: Mapping[str, str]) -> list[tuple[str, list[str], list[str], int]]:
    """``(qid, entered ids, left ids, version)`` of each change in one feed entry (its fields
    decoded), in the entry's order.

    Raises
    ------
    KeyError, ValueError
        A field missing or malformed (not an entry knnmon wrote).
    """
    version = int(fields["version"])
    out = []
    for line in fields["changes"].split("\n"):
        qid, entered, left = line.split("\t")
        out.append((qid, entered.split(), left.split(), version))
    return out
