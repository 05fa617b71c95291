"""Geo-tagged tweets -> candidate records, from either of two forms (sniffed per file):

- **CSV** (``shared/data/tweets``): header ``id,username,created_at,lng,lat,text``, quoted
  fields may hold commas, quotes and newlines. A row with the wrong number of fields is
  ``malformed_csv``.
- **Twitter API v1.1 JSON lines**: one tweet object per line; id ``id_str`` (else ``id``),
  point ``coordinates.coordinates`` = ``[lon, lat]``, text ``extended_tweet.full_text`` (else
  ``text``), time ``created_at`` (else ``timestamp_ms``). Tweets with only a ``place`` and no
  point are ``missing_coordinates``.

``t`` is ``created_at`` (``Wed Apr 13 02:53:13 +0000 2022``) in epoch ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from knnmon.ingest.places import json_lines
from knnmon.ingest.sources import TWEET_CSV_HEADER, sniff_tweet_format

__all__ = ["tweet_candidates", "split_tweet_files", "TWEET_SCHEMA"]

_S = T.StringType()
TWEET_SCHEMA = T.StructType([
    T.StructField("id_str", _S),
    T.StructField("id", _S),
    T.StructField("created_at", _S),
    T.StructField("timestamp_ms", _S),
    T.StructField("coordinates", T.StructType([
        T.StructField("type", _S), T.StructField("coordinates", T.ArrayType(_S)),
    ])),
    T.StructField("text", _S),
    T.StructField("extended_tweet", T.StructType([T.StructField("full_text", _S)])),
    T.StructField("_corrupt_record", _S),
])

_CSV_SCHEMA = ", ".join(f"{c} string" for c in (*TWEET_CSV_HEADER, "_corrupt_record"))


def created_at_ms(col: Column) -> Column:
    """Twitter's ``created_at`` (``EEE MMM dd HH:mm:ss Z yyyy``) -> int64 epoch ms, null if bad.

    Spark cannot parse day names, so the leading ``EEE `` is cut off first.
    """
    return F.unix_millis(F.try_to_timestamp(F.substring(col, 5, 64), F.lit("MMM dd HH:mm:ss Z yyyy")))


def _json_candidates(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    df = json_lines(spark, files, TWEET_SCHEMA)
    malformed = F.col("j").isNull() | F.col("j._corrupt_record").isNotNull()
    return df.select(
        "source", "raw",
        F.when(malformed, "malformed_json").alias("pre_reason"),
        F.coalesce("j.id_str", "j.id").alias("id"),
        F.expr("try_element_at(j.coordinates.coordinates, 1)").alias("lon_s"),
        F.expr("try_element_at(j.coordinates.coordinates, 2)").alias("lat_s"),
        F.coalesce(created_at_ms(F.col("j.created_at")), F.col("j.timestamp_ms").try_cast("bigint")).alias("t"),
        F.array(F.coalesce("j.extended_tweet.full_text", "j.text")).alias("texts"),
    )


def _csv_candidates(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    df = spark.read.csv(
        list(files), schema=_CSV_SCHEMA, header=True, multiLine=True, escape='"',
        mode="PERMISSIVE", columnNameOfCorruptRecord="_corrupt_record",
    )
    fields = F.to_json(F.struct(*TWEET_CSV_HEADER))
    return df.select(
        F.col("_metadata.file_path").alias("source"),
        F.coalesce("_corrupt_record", fields).alias("raw"),
        F.when(F.col("_corrupt_record").isNotNull(), "malformed_csv").alias("pre_reason"),
        "id", F.col("lng").alias("lon_s"), F.col("lat").alias("lat_s"),
        created_at_ms(F.col("created_at")).alias("t"),
        F.array("text").alias("texts"),
    )


def split_tweet_files(files: Sequence[str]) -> dict[str, list[str]]:
    """Group tweet files by form: ``{"json": [...], "csv": [...]}`` (sniffed, no Spark).

    Raises
    ------
    InputPathError
        A file that is neither JSON lines nor the tweet CSV.
    """
    forms: dict[str, list[str]] = {"json": [], "csv": []}
    for f in files:
        forms[sniff_tweet_format(f)].append(f)
    return forms


def tweet_candidates(spark: SparkSession, forms: dict[str, list[str]]) -> DataFrame:
    """Candidate frame (:data:`knnmon.ingest.records.candidate_columns`) of tweet files.

    ``forms`` is the output of :func:`split_tweet_files`.
    """
    frames = []
    if forms.get("json"):
        frames.append(_json_candidates(spark, forms["json"]))
    if forms.get("csv"):
        frames.append(_csv_candidates(spark, forms["csv"]))
    out = frames[0]
    for other in frames[1:]:
        out = out.unionByName(other)
    return out
