"""A worker's keyword codes: keyword -> int code, shared with the coordinator.

The coordinator encodes a batch's keywords with the codes of the queries' keywords it handed a
worker (:meth:`Vocabulary.learn`), so batches arrive as (object, keyword code) pairs; a keyword
first seen here (a query registered with a new keyword) gets the next free code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Vocabulary", "own"]


def own(text: str) -> str:
    """A fresh copy of ``text`` for the worker to keep. The ids of queries and objects arrive
    inside a call's arguments, unpickled among millions of short-lived objects (lists, tuples,
    floats); keeping those very strings pins every memory arena of the payload after the call
    (``benchmarks/worker_memory.py at 68de8c7``), while copies made here sit together."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


class Vocabulary:
    """Keyword -> code (``codes``); ``next_code`` is the code a new keyword gets.

    Parameters
    ----------
    codes
        The coordinator's codes of some keywords (:meth:`learn`).
    """

    def __init__(self, codes: Mapping[str, int] | None = None) -> None:
        self.codes: dict[str, int] = {}
        self.next_code = 0
        self.learn(codes)

    def __len__(self) -> int:
        return len(self.codes)

    def learn(self, codes: Mapping[str, int] | None) -> None:
        """Take the coordinator's codes of some keywords (those of the queries coming here)."""
        if codes:
            self.codes.update({own(w): int(c) for w, c in codes.items()})
            self.next_code = max(self.next_code, max(codes.values()) + 1)

    def code_row(self, words: Sequence[str]) -> list[int]:
        """The codes of a query's ``words``, giving new keywords new codes."""
        out = []
        for w in words:
            c = self.codes.get(w)
            if c is None:
                c = self.codes[own(w)] = self.next_code
                self.next_code += 1
            out.append(c)
        return out

    def encode(self, keywords: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """``(object, keyword code)`` pairs of a batch's ``keywords`` (``(p,)`` int64 each),
        keywords no query has left out."""
        pair_obj, pair_code = [], []
        get = self.codes.get
        for j, words in enumerate(keywords):
            for w in words:
                c = get(w)
                if c is not None:
                    pair_obj.append(j)
                    pair_code.append(c)
        return np.asarray(pair_obj, dtype=np.int64), np.asarray(pair_code, dtype=np.int64)
