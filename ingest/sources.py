"""Input paths: checked before Spark does any work, and the tweet format of each file sniffed."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable

from knnmon.errors import InputPathError

__all__ = ["check_input_paths", "sniff_tweet_format", "TWEET_CSV_HEADER"]

#: Header of the tweet CSV form (``shared/data/tweets``).
TWEET_CSV_HEADER = ("id", "username", "created_at", "lng", "lat", "text")


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def check_input_paths(paths: Iterable[str]) -> list[str]:
    """Expand and check input paths: every one must exist and be readable.

    A directory stands for the regular files directly inside it (hidden files and Spark's
    ``_SUCCESS``-style files are skipped). Each file is opened and its first bytes read
    (decompressed for ``.gz``), so an unreadable or corrupt-at-the-start file fails here, with
    its name, before Spark starts.

    Returns
    -------
    list[str]
        Absolute file paths, in the given order (directory contents sorted).

    Raises
    ------
    InputPathError
        No path given, a path that does not exist, an empty directory, or a file that cannot be
        opened or read.
    """
    files: list[str] = []
    for raw in paths:
        path = os.path.abspath(os.fspath(raw))
        if os.path.isdir(path):
            inside = sorted(
                os.path.join(path, f) for f in os.listdir(path)
                if not f.startswith((".", "_")) and os.path.isfile(os.path.join(path, f))
            )
            if not inside:
                raise InputPathError(f"input directory has no files: {raw}")
            files.extend(inside)
        elif os.path.exists(path):
            files.append(path)
        else:
            raise InputPathError(f"input path does not exist: {raw}")
    if not files:
        raise InputPathError("no input paths given")
    for path in files:
        try:
            with _open(path) as fh:
                fh.read(64)
        except (OSError, EOFError) as ex:
            raise InputPathError(f"cannot read input file {path}: {ex}") from ex
    return files


def sniff_tweet_format(path: str) -> str:
    """Return ``"json"`` (Twitter API v1.1 JSON lines) or ``"csv"`` (the GeotaggedTweets CSV).

    The first non-blank character decides: ``{`` means JSON lines, anything else CSV.

    Raises
    ------
    InputPathError
        A CSV file whose header is not ``id,username,created_at,lng,lat,text``.
    """
    with _open(path) as fh:
        head = fh.read(4096).decode("utf-8", errors="replace")
    stripped = head.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{"):
        return "json"
    header = tuple(c.strip().strip('"') for c in stripped.splitlines()[0].split(",")) if stripped else ()
    if header != TWEET_CSV_HEADER:
        raise InputPathError(
            f"{path}: not a tweet file: expected JSON lines or a CSV with header "
            f"{','.join(TWEET_CSV_HEADER)!r}; got {','.join(header)[:120]!r}"
        )
    return "csv"

