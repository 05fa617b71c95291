"""The exceptions knnmon raises; every one derives from :class:`KnnmonError`.

The CLI turns a :class:`KnnmonError` into a one-line message and exit status 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["KnnmonError", "InputPathError", "InvalidArgumentError", "InvalidQueryError"]


class KnnmonError(Exception):
    """Base class of all errors knnmon raises on purpose."""


class InputPathError(KnnmonError, FileNotFoundError):
    """An input path does not exist, is not a regular file or directory, or cannot be read."""


class InvalidArgumentError(KnnmonError, ValueError):
    """A parameter is outside its valid range; the message names it and the valid values."""


class InvalidQueryError(KnnmonError, ValueError):
    """A kNN query is invalid (no keyword after normalisation, ``k < 1``, bad coordinates)."""
