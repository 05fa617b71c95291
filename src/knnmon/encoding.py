"""Keyword lists to integer codes, vectorised with pyarrow (one helper for every vocabulary)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["keyword_codes"]


def keyword_codes(keywords: pa.Array | pa.ChunkedArray, vocabulary: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Codes of every keyword of a list<string> array.

    Parameters
    ----------
    keywords
        ``m`` lists of keywords.
    vocabulary
        string array; a keyword's code is its position there.

    Returns
    -------
    owner, code
        ``(e,)`` int64: the list each keyword belongs to (``0..m-1``) and its code, ``-1`` for a
        keyword not in ``vocabulary``.
    """
    if isinstance(keywords, pa.ChunkedArray):
        keywords = keywords.combine_chunks()
    owner = pc.list_parent_indices(keywords).to_numpy().astype(np.int64)
    code = pc.index_in(keywords.flatten(), value_set=vocabulary).fill_null(-1).to_numpy().astype(np.int64)
    return owner, code
