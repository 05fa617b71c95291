"""The exceptions knnmon raises; every one derives from :class:`KnnmonError`.

The CLI turns a :class:`KnnmonError` into a one-line message and exit status 2; anything else
is a bug and keeps its traceback. Errors of Redis and Ray are translated into these at the
edge where they happen (:func:`knnmon.connection.with_retries`,
:class:`knnmon.coordinator.runtime.worker_pool.RayPool`).
"""

from __future__ import annotations

__all__ = ["KnnmonError", "InputPathError", "InvalidArgumentError", "InvalidQueryError", "PoisonedWatermarkError",
           "REJECT_REASONS", "Rejected", "StoreUnavailableError", "WorkerLostError"]


class KnnmonError(Exception):
    """Base class of all errors knnmon raises on purpose."""


class InputPathError(KnnmonError, FileNotFoundError):
    """An input path does not exist, is not a regular file or directory, or cannot be read."""


class InvalidArgumentError(KnnmonError, ValueError):
    """A parameter is outside its valid range; the message names it and the valid values."""


class InvalidQueryError(KnnmonError, ValueError):
    """A kNN query is invalid (no keyword after normalisation, ``k < 1``, bad coordinates), or
    its id is registered already.

    ``reason`` is a key of :data:`REJECT_REASONS` for an invalid parameter (``None`` for a
    duplicate id) and ``detail`` the offending values: the stream protocol rejects an entry
    with them.
    """

    def __init__(self, message: str, reason: str | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.reason, self.detail = reason, detail


class StoreUnavailableError(KnnmonError):
    """Redis could not be reached after every retry; the message names the operation and URL."""


class PoisonedWatermarkError(KnnmonError):
    """What Redis holds has objects from the future that an earlier knnmon (or one with
    ``--max-future off``) accepted, or a persisted watermark beyond every bound: starting on it
    would silently change results. The message names them and the repair
    (``knnmon repair --watermark``)."""


class WorkerLostError(KnnmonError):
    """A worker (a Ray actor) died or became unreachable; ``worker`` is its number.

    Raised by the worker pool for any call to the lost worker, with Ray's error as the cause.
    """

    def __init__(self, worker: int, detail: str = "") -> None:
        super().__init__(f"worker {worker} was lost" + (f": {detail}" if detail else ""))
        self.worker = worker


#: Why an entry of an ingest stream is rejected (``knnmon serve``; the stream protocol,
#: :mod:`knnmon.protocol`).
REJECT_REASONS: dict[str, str] = {
    "field_too_large": "a field longer than 64 KiB",
    "not_utf8": "a field that is not UTF-8 text (bytes that do not decode, or a lone surrogate)",
    "missing_id": "no `id` field, or an empty one",
    "bad_id": "an `id` longer than 256 bytes, or holding whitespace, a control character or a lone surrogate (a query id: or `{`, `}`)",
    "missing_coordinates": "no `lon` or `lat`",
    "non_numeric_coordinates": "`lon` or `lat` is not a finite number",
    "longitude_out_of_range": "`lon` outside [-180, 180]",
    "latitude_out_of_range": "`lat` outside [-90, 90]",
    "null_island": "coordinates (0, 0): what a device reports without a position",
    "bad_time": "`t` is not an integer (epoch milliseconds) that fits 64 bits",
    "future": "`t` (or the entry id's time) ahead of its arrival (the entry id's time; Redis's clock) by more "
              "than `--max-future` (default 1m)",
    "no_keywords": "no `keywords`/`text`, or no keyword left after normalisation",
    "too_many_keywords": "more keywords than `limits.max_keywords` (default 32)",
    "duplicate_id": "an object id seen before (the first one is kept; with a window, seen within it)",
    "late": "with a window: `t` at or below the watermark minus the window (already expired)",
    "unknown_op": "`op` is missing or not `register` / `unregister`",
    "bad_k": "`k` missing, not an integer, or below 1",
    "k_too_large": "`k` above `limits.max_k` (default 1,000)",
    "internal_error": "applying the entry failed inside knnmon (a bug); `_detail` has the error",
}


class Rejected(KnnmonError, ValueError):
    """A stream entry that cannot be processed; ``reason`` is a key of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail or REJECT_REASONS[reason]}")
        self.reason, self.detail = reason, detail

    def __reduce__(self):
        """Pickled as its reason and detail (recovery reads the objects stream in a child process)."""
        return type(self), (self.reason, self.detail)
