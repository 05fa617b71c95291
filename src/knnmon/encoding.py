"""Strings to integers: keyword lists to vocabulary codes (vectorised with pyarrow, one helper for
every vocabulary), ids to order-preserving prefix keys, and ids to 64-bit hashes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["id_hashes", "id_prefix_keys", "keyword_codes", "string_buffers"]


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


def id_prefix_keys(ids) -> np.ndarray:
    """Order-preserving integer keys of ids: their first 8 UTF-8 bytes, big-endian, NUL-padded.

    ``key(a) < key(b)`` implies ``a < b`` (Python's string order is code-point order, which UTF-8
    byte order preserves); equal keys say nothing, and such pairs must be compared as strings.

    Parameters
    ----------
    ids
        ``m`` strings: a sequence, or a pyarrow string array (read from its buffers, no Python
        string per id; no nulls).

    Returns
    -------
    numpy.ndarray
        ``(m,)`` uint64.
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        return _arrow_prefix_keys(ids)
    raw = np.array([s.encode()[:8] for s in ids], dtype="S8") if len(ids) else np.empty(0, "S8")
    return raw.view(">u8").astype(np.uint64)


def _arrow_prefix_keys(ids: pa.Array) -> np.ndarray:
    """:func:`id_prefix_keys` of a string (or large string) array, from its offsets and bytes."""
    n = len(ids)
    if not n:
        return np.empty(0, dtype=np.uint64)
    offsets, data = string_buffers(ids)
    start = offsets[:-1]
    length = np.minimum(np.diff(offsets), 8)
    raw = np.zeros((n, 8), dtype=np.uint8)
    for j in range(8):
        has = length > j
        raw[has, j] = data[start[has] + j]
    return raw.reshape(-1).view(">u8").astype(np.uint64)


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The ``(m + 1,)`` int64 offsets (from the array's own offset, not rebased) and the
    ``uint8`` bytes of a string or large string array, read from its buffers; nulls read as
    empty strings.

    Raises
    ------
    TypeError
        ``arr`` is not a string array.
    """
    if arr.null_count:
        arr = arr.fill_null("")
    if pa.types.is_large_string(arr.type):
        width = np.int64
    elif pa.types.is_string(arr.type):
        width = np.int32
    else:
        raise TypeError(f"a string array is needed; got {arr.type}")
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=width)[arr.offset:arr.offset + n + 1].astype(np.int64, copy=False) \
        if n else np.zeros(1, dtype=np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, dtype=np.uint8)
    return offsets, data


def id_hashes(ids) -> np.ndarray:
    """64-bit hashes of ids (SipHash, ``pandas.util.hash_array``): equal ids hash equal, two
    different ids may share a hash (whoever looks ids up by hash confirms a hit by the ids).

    Parameters
    ----------
    ids
        ``m`` strings (a sequence).

    Returns
    -------
    numpy.ndarray
        ``(m,)`` uint64.
    """
    if not len(ids):
        return np.empty(0, dtype=np.uint64)
    import pandas as pd  # (only the id lookups need it)

    return pd.util.hash_array(np.asarray(ids, dtype=object), categorize=False)
