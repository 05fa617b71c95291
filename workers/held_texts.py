"""The details of every object a worker's lists hold, with a reserve: texts by object handle.

With a reserve (a window), a worker writes the details of an object that enters a result from
the reserve, long after the batch that brought it (:mod:`knnmon.workers.window_lists`), so it keeps
every held object's details (``lon lat t keywords``, :meth:`knnmon.batch.ObjectInfo.to_text`).
They are kept as a :class:`~knnmon.id_table.StringColumn` with a row per handle (``0``: none),
not a ``dict`` of id -> text: no Python object per held object. A text replaced or dropped
leaves its bytes until the handles' next compaction (:meth:`HeldTexts.renumber`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knnmon.arrays import with_capacity
from knnmon.id_table import StringColumn
from knnmon.workers.object_handles import ObjectHandles

__all__ = ["HeldTexts"]


class HeldTexts:
    """Details' texts of held objects by handle (module docstring).

    Parameters
    ----------
    handles
        The worker's :class:`~knnmon.workers.object_handles.ObjectHandles` (ids are looked up
        there; an id without a handle is not kept).
    """

    def __init__(self, handles: ObjectHandles) -> None:
        self._handles = handles
        self._texts = StringColumn()
        self._row = np.zeros(0, dtype=np.int64)  # per handle: 1 + its text's row, 0 for none

    def __len__(self) -> int:
        """Handles with a text."""
        return int(np.count_nonzero(self._row))

    def keep(self, handles: np.ndarray, texts: Sequence[str | None]) -> None:
        """Keep the ``texts`` of ``handles`` (``(m,)`` int64; ``-1``, an id without a handle, and a
        ``None`` text, left as it was, skipped)."""
        h = np.asarray(handles, dtype=np.int64)
        ok = np.flatnonzero((h >= 0) & np.fromiter((x is not None for x in texts), dtype=bool, count=len(h)))
        if not len(ok):
            return
        rows = self._texts.append([texts[j] for j in ok.tolist()])
        self._row = with_capacity(self._row, len(self._handles))
        self._row[h[ok]] = np.arange(rows.start, rows.stop) + 1

    def missing(self, handles: np.ndarray) -> np.ndarray:
        """``(m,)`` bool: which of ``handles`` (``(m,)`` int64, each ``>= 0``) have no text kept
        (an object's details never change: one kept is kept as it is)."""
        h = np.asarray(handles, dtype=np.int64)
        out = h >= len(self._row)
        out[~out] = self._row[h[~out]] == 0
        return out

    def get(self, oids: Sequence[str]) -> list[str | None]:
        """The texts of ``oids`` (``None`` where none is kept)."""
        return self.of_handles(self._handles.lookup(list(oids)))

    def of_handles(self, h: np.ndarray) -> list[str | None]:
        """The texts of handles ``h`` (``(m,)`` int64; ``None`` where none is kept, or ``-1``)."""
        h = np.asarray(h, dtype=np.int64)
        row = np.zeros(len(h), dtype=np.int64)
        ok = (h >= 0) & (h < len(self._row))
        row[ok] = self._row[h[ok]]
        out: list[str | None] = [None] * len(h)
        has = np.flatnonzero(row)
        for j, text in zip(has.tolist(), self._texts.names(row[has] - 1)):
            out[j] = text
        return out

    def drop(self, handles: np.ndarray) -> None:
        """Forget the texts of ``handles`` (expired objects)."""
        handles = np.asarray(handles, dtype=np.int64)
        self._row[handles[handles < len(self._row)]] = 0

    def renumber(self, used: np.ndarray) -> None:
        """Keep the texts of the sorted handles ``used`` only, renumbered as
        :meth:`ObjectHandles.compact` renumbers them (call it right after)."""
        used = np.asarray(used, dtype=np.int64)
        row = with_capacity(self._row, int(used.max(initial=-1)) + 1)[used]
        has = np.flatnonzero(row)
        self._texts.keep(row[has] - 1)
        self._row = np.zeros(len(used), dtype=np.int64)
        self._row[has] = np.arange(len(has)) + 1
