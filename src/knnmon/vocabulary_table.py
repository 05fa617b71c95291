"""Keyword -> code as an open-addressing hash table over the keywords' UTF-8 bytes, with
compiled lookups straight from Arrow string arrays.

The routing table encodes every batch's keywords against the queries' vocabulary (millions of
keywords at the paper's scale). A Python ``dict`` needs a Python string per keyword looked up
and about 100 bytes per keyword held; pyarrow's ``index_in`` rebuilds a hash set of the whole
vocabulary on every call. Here the vocabulary's bytes sit in one ``uint8`` buffer with ``int64``
offsets, its hash table is an ``int32`` array of codes (linear probing, 64-bit FNV-1a from a
random basis per table, at most half full), and a lookup reads the Arrow array's own buffers:
no Python object per keyword.
A keyword's code is its position in the order added; codes are never reused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from knnmon.arrays import with_capacity
from knnmon.encoding import string_buffers
from knnmon.jit import jit as _jit

__all__ = ["VocabularyTable", "compile_vocabulary_kernels"]


@_jit
def _hash(data: np.ndarray, start: int, end: int, seed: np.uint64) -> np.uint64:
    """64-bit FNV-1a of ``data[start:end]`` (uint8) from the basis ``seed``, then MurmurHash3's
    finaliser (the slot is the low bits: every byte must reach them)."""
    h = seed
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


@_jit
def _same(a: np.ndarray, a0: int, a1: int, b: np.ndarray, b0: int, b1: int) -> bool:
    """Whether ``a[a0:a1] == b[b0:b1]`` (uint8)."""
    if a1 - a0 != b1 - b0:
        return False
    for i in range(a1 - a0):
        if a[a0 + i] != b[b0 + i]:
            return False
    return True


@_jit
def _find(slots: np.ndarray, offsets: np.ndarray, data: np.ndarray, q: np.ndarray, q0: int, q1: int,
          seed: np.uint64) -> int:
    """The code of ``q[q0:q1]`` in the table, or ``-1``."""
    mask = len(slots) - 1
    s = np.int64(_hash(q, q0, q1, seed) & np.uint64(mask))
    while True:
        c = slots[s]
        if c < 0:
            return -1
        if _same(data, offsets[c], offsets[c + 1], q, q0, q1):
            return c
        s = (s + 1) & mask


@_jit
def _lookup(slots: np.ndarray, offsets: np.ndarray, data: np.ndarray, q_offsets: np.ndarray, q_data: np.ndarray,
            out: np.ndarray, seed: np.uint64) -> None:
    """``out[i]``: the code of string ``i`` of an Arrow array given by its offsets (``(m + 1,)``,
    rebased to 0 or not) and bytes, ``-1`` if absent.

    In passes: every string's hash, its first slot, then the first candidates' offsets, then each
    is compared (probing on if it is not the string). The reads of one pass do not wait for each
    other, so the cache misses of many strings overlap: in a vocabulary of millions, about 3x
    faster than one string after another."""
    m, mask = len(out), len(slots) - 1
    for i in range(m):
        out[i] = np.int64(_hash(q_data, q_offsets[i], q_offsets[i + 1], seed) & np.uint64(mask))
    for i in range(m):
        out[i] = slots[out[i]]
    start = np.zeros(m, dtype=np.int64)
    for i in range(m):
        if out[i] >= 0:
            start[i] = offsets[out[i]]
    for i in range(m):
        c, q0, q1 = out[i], q_offsets[i], q_offsets[i + 1]
        if c < 0 or not _same(data, start[i], offsets[c + 1], q_data, q0, q1):
            out[i] = -1 if c < 0 else _find(slots, offsets, data, q_data, q0, q1, seed)


@_jit
def _place(slots: np.ndarray, offsets: np.ndarray, data: np.ndarray, first: int, last: int, seed: np.uint64) -> None:
    """Put codes ``first..last-1`` (absent from the table) into ``slots``."""
    mask = len(slots) - 1
    for c in range(first, last):
        s = np.int64(_hash(data, offsets[c], offsets[c + 1], seed) & np.uint64(mask))
        while slots[s] >= 0:
            s = (s + 1) & mask
        slots[s] = c


class VocabularyTable:
    """Keyword -> code (module docstring).

    Parameters
    ----------
    words
        The vocabulary: a sequence of ``str`` or an Arrow string array; word ``i`` gets code
        ``i``. The words must be distinct.

    Raises
    ------
    ValueError
        A word appears twice.
    """

    def __init__(self, words: Iterable[str] | pa.Array = ()) -> None:
        arr = words if isinstance(words, pa.Array) else pa.array(list(words), type=pa.string())
        offsets, data = string_buffers(arr)
        self.size = len(arr)
        # A random basis per table: keywords come from users, who cannot then pick words that
        # share a slot and make every lookup probe a long run.
        self._seed = np.uint64(int.from_bytes(os.urandom(8), "little"))
        self._arrays = _hashed(offsets - offsets[0], data[offsets[0]:offsets[-1]].copy(), self.size, self._seed)
        if self.size and int((self.codes(arr) != np.arange(self.size)).sum()):
            raise ValueError("the vocabulary's words must be distinct")

    def __len__(self) -> int:
        return self.size

    def codes(self, words: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """``(m,)`` int64: the code of each word of a string array, ``-1`` for a word not held.
        Safe beside another thread's :meth:`add`: a word being added is found or not."""
        if isinstance(words, pa.ChunkedArray):
            words = words.combine_chunks()
        out = np.empty(len(words), dtype=np.int64)
        if len(words):
            q_offsets, q_data = string_buffers(words)
            slots, offsets, data = self._arrays
            _lookup(slots, offsets, data, q_offsets, q_data, out, self._seed)
        return out

    def code(self, word: str) -> int:
        """The code of ``word``, ``-1`` if not held."""
        return int(self.codes(pa.array([word], type=pa.string()))[0])

    def add(self, word: str) -> int:
        """The code of ``word``, added with the next code if new (one thread adds at a time).

        The word's bytes and end go past the held words first, and its slot last; when the bytes
        or ends must grow, or the slots, all three are published at once with fresh slots: a
        reader sees the word whole or not at all."""
        c = self.code(word)
        if c >= 0:
            return c
        raw = np.frombuffer(word.encode("utf-8"), dtype=np.uint8)
        slots, offsets, data = self._arrays
        end = int(offsets[self.size])
        if end + len(raw) > len(data) or self.size + 2 > len(offsets) or 2 * (self.size + 1) > len(slots):
            offsets, data = with_capacity(offsets, self.size + 2), with_capacity(data, end + len(raw))
            data[end:end + len(raw)] = raw
            offsets[self.size + 1] = end + len(raw)
            self._arrays = _hashed(offsets, data, self.size + 1, self._seed)
        else:
            data[end:end + len(raw)] = raw
            offsets[self.size + 1] = end + len(raw)
            _place(slots, offsets, data, self.size, self.size + 1, self._seed)
        self.size += 1
        return self.size - 1

    @property
    def nbytes(self) -> int:
        """Memory of the table's arrays in bytes."""
        return int(sum(a.nbytes for a in self._arrays))


def _hashed(offsets: np.ndarray, data: np.ndarray, size: int,
            seed: np.uint64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(slots, offsets, data)`` with ``size`` words placed in fresh slots."""
    slots = np.full(_capacity(size), -1, dtype=np.int32)
    _place(slots, offsets, data, 0, size, seed)
    return slots, offsets, data


def _capacity(size: int) -> int:
    """Slots for ``size`` codes: a power of two, at least twice ``size``."""
    return 1 << max(4, int(2 * size).bit_length())


def compile_vocabulary_kernels() -> None:
    """Compile (or load from numba's cache) the kernels before the first batch needs them."""
    VocabularyTable(["a"]).add("b")
