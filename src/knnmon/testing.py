"""Helpers for tests of knnmon and of code built on it: slices of real data files."""

from __future__ import annotations

import gzip
from os import PathLike

__all__ = ["head_lines"]


def head_lines(path: str | PathLike[str], n: int) -> list[str]:
    """The first ``n`` lines of a text file (gzip if the name ends in ``.gz``), newlines removed."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            out.append(line.rstrip("\n"))
            if len(out) == n:
                break
    return out
