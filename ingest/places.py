"""SimpleGeo places (GeoJSON Feature lines, gzip or plain) -> candidate records.

Per record (see ``shared/data/README.md``):

- ``id``: the GeoJSON ``id`` before ``@`` (``SG_<hash>_<lat>_<lon>``);
- ``t``: the version time after ``@`` (epoch seconds) x 1000 -> epoch ms (``bad_time`` if absent);
- ``lon``, ``lat``: ``geometry.coordinates`` (a ``Point``);
- keyword text: every classifier's ``type``, ``category``, ``subcategory`` and every tag; with
  ``with_names`` also the place's ``name``.

Blank lines are not records. Everything else is read and counted, and kept or rejected by
:func:`knnmon.ingest.records.validate`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = ["place_candidates", "PLACE_SCHEMA"]

_S = T.StringType()
PLACE_SCHEMA = T.StructType([
    T.StructField("id", _S),
    T.StructField("geometry", T.StructType([
        T.StructField("type", _S), T.StructField("coordinates", T.ArrayType(_S)),
    ])),
    T.StructField("properties", T.StructType([
        T.StructField("name", _S),
        T.StructField("classifiers", T.ArrayType(T.StructType([
            T.StructField("type", _S), T.StructField("category", _S), T.StructField("subcategory", _S),
        ]))),
        T.StructField("tags", T.ArrayType(_S)),
    ])),
    T.StructField("_corrupt_record", _S),
])

_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}


def json_lines(spark: SparkSession, files: Sequence[str], schema: T.StructType) -> DataFrame:
    """Non-blank lines of ``files`` as ``raw``, ``source`` and the parsed struct ``j``.

    ``j._corrupt_record`` is set when a line is not a JSON object of ``schema``'s field types.
    """
    lines = spark.read.text(list(files)).select(
        F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source")
    ).where(F.trim("raw") != "")
    return lines.withColumn("j", F.from_json("raw", schema, _JSON_OPTIONS))


def place_candidates(spark: SparkSession, files: Sequence[str], *, with_names: bool = False) -> DataFrame:
    """Candidate frame (:data:`knnmon.ingest.records.candidate_columns`) of place files."""
    df = json_lines(spark, files, PLACE_SCHEMA)
    sid = F.col("j.id")
    has_version = F.instr(sid, "@") > 0
    version_s = F.when(has_version, F.substring_index(sid, "@", -1))
    classifier_texts = F.flatten(F.transform(
        F.coalesce(F.col("j.properties.classifiers"), F.array()),
        lambda c: F.array(c["type"], c["category"], c["subcategory"]),
    ))
    parts = [classifier_texts, F.coalesce(F.col("j.properties.tags"), F.array().cast("array<string>"))]
    if with_names:
        parts.append(F.array(F.col("j.properties.name")))
    malformed = F.col("j").isNull() | F.col("j._corrupt_record").isNotNull()
    return df.select(
        "source", "raw",
        F.when(malformed, "malformed_json")
        .when(F.col("j.geometry.type") != "Point", "not_a_point").alias("pre_reason"),
        F.substring_index(sid, "@", 1).alias("id"),
        F.expr("try_element_at(j.geometry.coordinates, 1)").alias("lon_s"),
        F.expr("try_element_at(j.geometry.coordinates, 2)").alias("lat_s"),
        F.try_multiply(version_s.try_cast("bigint"), F.lit(1000).cast("bigint")).alias("t"),
        F.concat(*parts).alias("texts"),
    )
