"""The ingest jobs behind ``knnmon ingest places|tweets``: check inputs, run Spark, write outputs."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from knnmon.errors import InvalidArgumentError
from knnmon.grid import DEFAULT_GRID
from knnmon.ingest.output import Inputs, Manifest, write_outputs
from knnmon.ingest.places import place_candidates
from knnmon.ingest.records import validate
from knnmon.ingest.sources import check_input_paths
from knnmon.ingest.spark import DEFAULT_MASTER, spark_session
from knnmon.ingest.tweets import split_tweet_files, tweet_candidates
from knnmon.limits import DEFAULT_MAX_FUTURE_MS

__all__ = ["ingest_places", "ingest_tweets", "check_output_dir", "DEFAULT_GRID"]

#: Default statistics grid: 128 x 128 cells over the data's bounding box.


def check_output_dir(out_dir: str) -> str:
    """Absolute output directory; raises :class:`InvalidArgumentError` if it is a file."""
    out = os.path.abspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InvalidArgumentError(f"--out must be a directory; {out_dir} is a file")
    return out


def _check_grid(grid_n: int) -> None:
    if grid_n < 1:
        raise InvalidArgumentError(f"--grid must be >= 1; got {grid_n}")


def _event_time(max_future_ms: int | None) -> dict[str, int | None]:
    """The ingest run's clock (now, epoch ms) and the bound on the future, for :func:`validate`
    and the manifest (``event_time``)."""
    return {"clock_ms": int(time.time() * 1000), "max_future_ms": max_future_ms}


def ingest_places(paths: Sequence[str], out_dir: str, *, grid_n: int = DEFAULT_GRID, master: str = DEFAULT_MASTER,
                  with_names: bool = False, stem: bool = False,
                  max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS) -> Manifest:
    """Ingest SimpleGeo place files into ``out_dir`` (layout in :mod:`knnmon.ingest`).

    Parameters
    ----------
    paths
        GeoJSON Feature-lines files (``.gz`` or plain) or directories of them.
    grid_n
        The statistics grid is ``grid_n x grid_n`` cells over the kept objects' bounding box.
    master
        Spark master URL.
    with_names, stem
        Keyword options (:mod:`knnmon.keywords`).
    max_future_ms
        Reject records whose ``t`` leads the run's own clock (its start) by more than this, ms,
        as ``future`` (``None``: no bound). The manifest's ``event_time`` records both.

    Returns
    -------
    Manifest
        As written to ``out_dir/manifest.json``.

    Raises
    ------
    InputPathError
        A missing or unreadable input (before Spark starts).
    InvalidArgumentError
        ``grid_n < 1`` or ``out_dir`` is a file.
    """
    started = time.perf_counter()
    _check_grid(grid_n)
    files = check_input_paths(paths)
    out = check_output_dir(out_dir)
    spark = spark_session(master)
    when = _event_time(max_future_ms)
    frame = validate(place_candidates(spark, files, with_names=with_names), stem=stem, **when)
    return write_outputs(frame, out, grid_n=grid_n, started=started, source=Inputs(
        "places", files, {"stem": stem, "with_names": with_names}, event_time=when))


def ingest_tweets(paths: Sequence[str], out_dir: str, *, grid_n: int = DEFAULT_GRID, master: str = DEFAULT_MASTER,
                  stem: bool = False, max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS) -> Manifest:
    """Ingest tweet files (CSV or API v1.1 JSON lines, mixed freely) into ``out_dir``.

    Parameters and errors as :func:`ingest_places`; a file in neither tweet form is an
    :class:`~knnmon.errors.InputPathError` before Spark starts.
    """
    started = time.perf_counter()
    _check_grid(grid_n)
    files = check_input_paths(paths)
    forms = split_tweet_files(files)
    out = check_output_dir(out_dir)
    spark = spark_session(master)
    when = _event_time(max_future_ms)
    frame = validate(tweet_candidates(spark, forms), stem=stem, **when)
    return write_outputs(frame, out, grid_n=grid_n, started=started, source=Inputs(
        "tweets", files, {"stem": stem, "with_names": False}, event_time=when,
        forms={k: len(v) for k, v in forms.items()}))
