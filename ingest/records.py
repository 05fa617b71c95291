"""Validation shared by every source: each input record is kept or rejected with one reason.

A source (places, tweets) turns its raw records into a *candidate frame* with the columns

``source`` (input file), ``raw`` (the original record text), ``pre_reason`` (a reason the source
itself found -- malformed JSON or CSV, a non-Point geometry -- or null), ``id``, ``lon_s``,
``lat_s`` (coordinates as text), ``t`` (int64 epoch ms or null) and ``texts`` (array<string>:
the text the keywords come from).

:func:`validate` adds ``lon``, ``lat``, ``keywords`` and ``reason`` -- null for a kept record,
else the first failing rule of :data:`REJECT_REASONS`, in that order, with a ``detail`` where the
reason alone does not say enough (``future``: both times) -- and marks all but one record of each
id as ``duplicate_id`` (the newest ``t`` is kept). Every record ends with exactly one outcome, so
``kept + rejected == read``. The bounds are those ``knnmon serve`` applies to a stream entry
(:mod:`knnmon.limits`, its defaults): an object ingest keeps is never rejected by the service for
its id, its keywords' number or their size.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from knnmon.errors import Rejected
from knnmon.keywords import normalize_keywords
from knnmon.limits import DEFAULT_LIMITS, MAX_FIELD_BYTES, Limits, parse_id

__all__ = ["REJECT_REASONS", "validate", "keywords_udf", "candidate_columns"]

#: Reject reasons, in the order they are checked, with what each means.
REJECT_REASONS: dict[str, str] = {
    "malformed_json": "not valid JSON, not a JSON object, or a field of the wrong JSON type",
    "malformed_csv": "a CSV row with the wrong number of fields or broken quoting",
    "not_a_point": "a place whose geometry is not a GeoJSON Point",
    "field_too_large": "keywords longer than 64 KiB in all, space separated (the streams' bound on a field)",
    "missing_id": "no id (GeoJSON `id`; tweet `id_str`/`id`)",
    "bad_id": "an id longer than 256 bytes, or holding whitespace, a control character or a lone surrogate",
    "missing_coordinates": "no longitude or latitude",
    "non_numeric_coordinates": "a coordinate that is not a finite number",
    "latitude_out_of_range": "latitude outside [-90, 90]",
    "longitude_out_of_range": "longitude outside [-180, 180]",
    "null_island": "coordinates exactly (0, 0): what a device reports without a position",
    "bad_time": "no parseable time (places: version after '@' in the id; tweets: created_at)",
    "future": "a time ahead of the ingest run's clock by more than --max-future (default 1m)",
    "no_keywords": "no keyword left after normalisation",
    "too_many_keywords": "more keywords than the service's default limits.max_keywords (32)",
    "duplicate_id": "an id seen before; the record with the newest time is kept",
}

#: Columns a source must provide to :func:`validate`.
candidate_columns = ("source", "raw", "pre_reason", "id", "lon_s", "lat_s", "t", "texts")


def keywords_udf(stem: bool):
    """A pandas UDF ``array<string> -> array<string>`` applying :func:`normalize_keywords`."""

    @F.pandas_udf(T.ArrayType(T.StringType()))
    def keywords(texts: pd.Series) -> pd.Series:
        return pd.Series([normalize_keywords(x, stem=stem) if x is not None else [] for x in texts])

    return keywords


@F.pandas_udf(T.StringType())
def _id_reason(ids: pd.Series) -> pd.Series:
    """``bad_id`` where :func:`knnmon.limits.parse_id` rejects the id (the streams' rule), else null."""
    def reason(oid: str | None) -> str | None:
        try:
            parse_id(oid)
        except Rejected as r:
            return r.reason if r.reason == "bad_id" else None
        return None

    return pd.Series([reason(x) for x in ids])


def _not_finite(c: Column) -> Column:
    return c.isNull() | F.isnan(c) | (F.abs(c) == float("inf"))


def validate(candidates: DataFrame, *, stem: bool = False, dedupe: bool = True, clock_ms: int | None = None,
             max_future_ms: int | None = None, limits: Limits = DEFAULT_LIMITS) -> DataFrame:
    """Apply the reject rules to a candidate frame.

    Parameters
    ----------
    candidates
        Columns :data:`candidate_columns` (see the module docstring).
    stem
        Stem keywords (see :func:`~knnmon.keywords.normalize_keywords`).
    dedupe
        Reject all but the newest record of each id as ``duplicate_id`` (costs one shuffle).
    clock_ms, max_future_ms
        The ingest run's clock (epoch ms) and how far a record's ``t`` may lead it (ms; either
        ``None``: no bound): a record further ahead is rejected as ``future``.
    limits
        The bounds on an object's keywords (``limits.max_keywords``), as the service's.

    Returns
    -------
    DataFrame
        ``id`` string, ``lon``/``lat`` float64 degrees, ``t`` int64 epoch ms, ``keywords``
        array<string>, ``reason`` string (null when kept), ``detail`` string (null but for
        ``future``), ``source`` string, ``raw`` string (null when kept, to keep the persisted
        frame small).
    """
    lon = F.expr("try_cast(lon_s as double)")
    lat = F.expr("try_cast(lat_s as double)")
    df = candidates.select(
        "source", "raw", "pre_reason", "id", "lon_s", "lat_s", "t",
        lon.alias("lon"), lat.alias("lat"), keywords_udf(stem)(F.col("texts")).alias("keywords"),
    )
    reason = (
        F.when(F.col("pre_reason").isNotNull(), F.col("pre_reason"))
        .when(F.octet_length(F.concat_ws(" ", "keywords")) > MAX_FIELD_BYTES, "field_too_large")
        .when(F.col("id").isNull() | (F.trim("id") == ""), "missing_id")
        .when(_id_reason(F.col("id")).isNotNull(), "bad_id")
        .when(F.col("lon_s").isNull() | F.col("lat_s").isNull(), "missing_coordinates")
        .when(_not_finite(F.col("lon")) | _not_finite(F.col("lat")), "non_numeric_coordinates")
        .when((F.col("lat") < -90) | (F.col("lat") > 90), "latitude_out_of_range")
        .when((F.col("lon") < -180) | (F.col("lon") > 180), "longitude_out_of_range")
        .when((F.col("lon") == 0) & (F.col("lat") == 0), "null_island")
        .when(F.col("t").isNull(), "bad_time")
    )
    bounded = clock_ms is not None and max_future_ms is not None
    if bounded:
        reason = reason.when(F.col("t") - F.lit(int(clock_ms)) > F.lit(int(max_future_ms)), "future")
    reason = reason.when(F.size("keywords") == 0, "no_keywords")
    reason = reason.when(F.size("keywords") > limits.max_keywords, "too_many_keywords")
    df = df.withColumn("reason", reason)
    detail = F.lit(None).cast("string")
    if bounded:
        detail = F.when(F.col("reason") == "future", F.format_string(
            "t=%d is %d ms ahead of the ingest run's clock (%d); at most %d ms (--max-future)",
            F.col("t"), F.col("t") - F.lit(int(clock_ms)), F.lit(int(clock_ms)), F.lit(int(max_future_ms))))
    df = df.withColumn("detail", detail)
    if dedupe:
        kept = F.col("reason").isNull()
        order = Window.partitionBy("id", kept).orderBy(
            F.col("t").desc(), "lon", "lat", "source", "raw"
        )
        df = df.withColumn(
            "reason", F.when(kept & (F.row_number().over(order) > 1), "duplicate_id").otherwise(F.col("reason"))
        )
    return df.select(
        "id", "lon", "lat", F.col("t").cast("long").alias("t"), "keywords", "reason", "detail", "source",
        F.when(F.col("reason").isNotNull(), F.col("raw")).alias("raw"),
    )
