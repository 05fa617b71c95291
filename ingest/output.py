"""Writes an ingest's outputs: objects, rejects, per-cell keyword statistics and the manifest."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from knnmon.grid import Grid
from knnmon.ingest.reading import MANIFEST, OBJECTS, REJECTS, STATS
from knnmon.ingest.records import REJECT_REASONS

__all__ = ["Inputs", "Manifest", "RecordCounts", "write_outputs", "keyword_stats", "OBJECTS", "STATS", "REJECTS",
           "MANIFEST"]



@dataclass(frozen=True)
class Inputs:
    """What an ingest read and how, as its job states it: ``kind`` (``places``, ``tweets``,
    ``synthetic``), the input files, the keyword options (``normalisation``: ``stem``,
    ``with_names``); ingest of real data: ``event_time`` (the run's clock ``clock_ms`` and the
    future bound ``max_future_ms``); tweets: ``forms`` (files per form); synthetic: its
    ``description`` and generator ``parameters``."""

    kind: str
    inputs: list[str]
    normalisation: dict[str, bool]
    synthetic: bool = False
    event_time: dict[str, int | None] | None = None
    forms: dict[str, int] | None = None
    description: str | None = None
    parameters: dict[str, object] | None = None


@dataclass(frozen=True)
class RecordCounts:
    """Records read, kept and rejected (in all and by reason, the reasons with any)."""

    read: int
    kept: int
    rejected: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of an ingest output (written as :func:`dataclasses.asdict`, the
    :class:`Inputs` fields that are set at the top level): the counts, ``distinct_keywords``,
    ``mean_keywords_per_object``, the kept objects' ``bbox`` (lon/lat min, max; ``None``: none
    kept), the statistics' ``grid`` (:meth:`~knnmon.grid.Grid.to_dict`; only ``n`` with no
    objects), the output files, Spark's version and master, when (UTC) and how long (s)."""

    source: Inputs
    records: RecordCounts
    distinct_keywords: int
    mean_keywords_per_object: float
    bbox: list[float] | None
    grid: dict[str, object]
    outputs: dict[str, str]
    spark: dict[str, str]
    created_at: str
    elapsed_s: float

    def to_json(self) -> dict[str, object]:
        """The manifest's JSON object."""
        out = asdict(self)
        return {**{k: v for k, v in out.pop("source").items() if v is not None}, **out}


def keyword_stats(objects: DataFrame, grid: Grid) -> DataFrame:
    """Objects per grid cell and keyword: the input of the load model.

    Parameters
    ----------
    objects
        Kept objects: ``lon``, ``lat`` (float64 degrees), ``keywords`` (array<string>).
    grid
        The grid (:class:`~knnmon.grid.Grid`); cells are computed by
        :meth:`Grid.cell_of`, so Spark and numpy agree on every cell.

    Returns
    -------
    DataFrame
        ``cell``, ``cx``, ``cy`` (int32), ``keyword`` (string), ``count`` (int64), sorted by
        ``(cell, keyword)``. ``count / N`` (``N`` = objects kept) is ``P(c, key)`` of the paper's
        formula (7).
    """

    @F.pandas_udf(T.IntegerType())
    def cell(lon: pd.Series, lat: pd.Series) -> pd.Series:
        return pd.Series(grid.cell_of(lon.to_numpy(), lat.to_numpy()))

    n = F.lit(grid.n)
    return (
        objects.select(cell("lon", "lat").alias("cell"), F.explode("keywords").alias("keyword"))
        .groupBy("cell", "keyword")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(
            F.col("cell").cast("int"), (F.col("cell") % n).cast("int").alias("cx"),
            F.floor(F.col("cell") / n).cast("int").alias("cy"), "keyword", "count",
        )
        .orderBy("cell", "keyword")
    )


def write_outputs(frame: DataFrame, out_dir: str, *, grid_n: int, source: Inputs, started: float) -> Manifest:
    """Write ``objects.parquet``, ``rejects/``, ``stats.parquet`` and ``manifest.json``.

    Parameters
    ----------
    frame
        Output of :func:`~knnmon.ingest.records.validate` (``reason`` null = kept).
    out_dir
        Output directory (created; existing outputs in it are replaced).
    grid_n
        Grid size ``n`` of the statistics (``n x n`` cells over the kept objects' bounding box).
    source
        What was read and how, recorded as it is.
    started
        ``time.perf_counter()`` at the start of the job, for ``elapsed_s``.

    Returns
    -------
    Manifest
        As written.
    """
    os.makedirs(out_dir, exist_ok=True)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        by_reason = {r["reason"]: r["count"] for r in frame.groupBy("reason").count().collect()}
        kept_n = by_reason.pop(None, 0)
        kept = frame.where(F.col("reason").isNull()).select("id", "lon", "lat", "t", "keywords")
        kept.orderBy("t", "id").write.mode("overwrite").parquet(os.path.join(out_dir, OBJECTS))
        (frame.where(F.col("reason").isNotNull())
         .select("reason", *(["detail"] if "detail" in frame.columns else []), "source", F.col("raw").alias("record"))
         .coalesce(1).write.mode("overwrite").json(os.path.join(out_dir, REJECTS)))
        summary = kept.agg(
            F.min("lon").alias("min_lon"), F.min("lat").alias("min_lat"),
            F.max("lon").alias("max_lon"), F.max("lat").alias("max_lat"),
            F.avg(F.size("keywords")).alias("mean_keywords"),
        ).first()
        vocabulary = kept.select(F.explode("keywords")).distinct().count()
        grid = None
        if kept_n:
            grid = Grid.covering(summary["min_lon"], summary["min_lat"], summary["max_lon"], summary["max_lat"], grid_n)
            keyword_stats(kept, grid).write.mode("overwrite").parquet(os.path.join(out_dir, STATS))
        else:
            frame.sparkSession.createDataFrame(
                [], "cell int, cx int, cy int, keyword string, count long"
            ).write.mode("overwrite").parquet(os.path.join(out_dir, STATS))
    finally:
        frame.unpersist()
    rejected = sum(by_reason.values())
    result = Manifest(
        source=source,
        records=RecordCounts(kept_n + rejected, kept_n, rejected,
                             {r: by_reason.get(r, 0) for r in REJECT_REASONS if by_reason.get(r)}),
        distinct_keywords=vocabulary,
        mean_keywords_per_object=float(summary["mean_keywords"]) if kept_n else 0.0,
        bbox=[summary["min_lon"], summary["min_lat"], summary["max_lon"], summary["max_lat"]] if kept_n else None,
        grid=grid.to_dict() if grid else {"n": grid_n},
        outputs={"objects": OBJECTS, "stats": STATS, "rejects": REJECTS},
        spark={"version": frame.sparkSession.version, "master": frame.sparkSession.sparkContext.master},
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        elapsed_s=round(time.perf_counter() - started, 3),
    )
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(result.to_json(), fh, indent=2)
        fh.write("\n")
    return result
