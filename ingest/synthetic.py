"""A **synthetic** Twitter-scale object stream following the paper's Table 1 statistics.

Tsuruoka et al. (2019), Table 1: Twitter -- 20,000,000 objects, 2,225,654 keywords, 5.51
keywords per object, restricted to 20-50 N, 60-125 W. No such real corpus is available here,
so this generator produces one with the same shape, and every output says ``synthetic``:

- **Locations**: a mixture of ``clusters`` Gaussian blobs (city-like), centres uniform in the
  box, blob weights Zipf-like (``1 / rank``), blob sigma log-uniform in [0.02, 0.5] degrees;
  points falling outside the box are redrawn uniformly inside it.
- **Keywords**: ``1 + Poisson(lam)`` draws per object from a Zipf(``zipf_s``) law over a
  vocabulary of ``vocabulary`` words named ``w<rank>`` (``w1`` most frequent); duplicates within an
  object are merged, and ``lam`` is solved so that the *distinct* keywords per object average
  ``mean_keywords`` (see :func:`poisson_rate`).
- **Time**: object ``i`` has ``t = start_ms + i * interval_ms``; ids are ``s<i>``.

Generation is in blocks of :data:`BLOCK` ids, each from its own ``numpy`` generator seeded by
``(seed, block)``, so the output depends on the parameters only, not on Spark's partitioning.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from knnmon.errors import InvalidArgumentError
from knnmon.ingest.jobs import check_output_dir
from knnmon.ingest.output import Inputs, Manifest, write_outputs
from knnmon.ingest.spark import DEFAULT_MASTER, spark_session

__all__ = ["SyntheticSpec", "synthetic_block", "poisson_rate", "ingest_synthetic", "BLOCK", "PAPER_BBOX"]

#: Objects generated per block (one numpy generator per block).
BLOCK = 65_536
#: The paper's region: ``(min_lon, min_lat, max_lon, max_lat)`` = 125-60 W, 20-50 N.
PAPER_BBOX = (-125.0, 20.0, -60.0, 50.0)


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the synthetic stream (defaults: the paper's Twitter row of Table 1).

    Raises
    ------
    InvalidArgumentError
        ``n < 1``, ``vocabulary < 1``, ``mean_keywords < 1``, ``zipf_s <= 0``, ``clusters < 1``.
    """

    n: int
    vocabulary: int = 2_225_654
    mean_keywords: float = 5.51
    zipf_s: float = 1.0
    clusters: int = 1_000
    seed: int = 0
    start_ms: int = 1_577_836_800_000  # 2020-01-01T00:00:00Z
    interval_ms: int = 5

    def __post_init__(self) -> None:
        checks = [("n", self.n >= 1), ("vocabulary", self.vocabulary >= 1), ("mean_keywords", self.mean_keywords >= 1),
                  ("zipf_s", self.zipf_s > 0), ("clusters", self.clusters >= 1), ("interval_ms", self.interval_ms >= 0)]
        for name, ok in checks:
            if not ok:
                raise InvalidArgumentError(f"synthetic {name} out of range: {getattr(self, name)!r}")


@functools.lru_cache(maxsize=4)
def _zipf_cdf(vocabulary: int, s: float) -> np.ndarray:
    w = np.arange(1, vocabulary + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


def poisson_rate(spec: SyntheticSpec) -> float:
    """Rate ``lam`` of ``m = 1 + Poisson(lam)`` draws that gives ``mean_keywords`` distinct ones.

    With ``q = sum_r p_r^2`` (the chance two draws are the same word), the expected number of
    distinct words is about ``m - C(m, 2) q``, and ``E[C(m, 2)] = lam + lam^2 / 2``, so ``lam``
    solves ``(q / 2) lam^2 - (1 - q) lam + (mean_keywords - 1) = 0`` (smaller root).
    """
    cdf = _zipf_cdf(spec.vocabulary, spec.zipf_s)
    p = np.diff(cdf, prepend=0.0)
    q = float(np.sum(p * p))
    target = spec.mean_keywords - 1.0
    if q < 1e-12:
        return target
    disc = (1 - q) ** 2 - 2 * q * target
    if disc < 0:
        raise InvalidArgumentError(
            f"a vocabulary of {spec.vocabulary} words with zipf_s={spec.zipf_s} cannot give "
            f"{spec.mean_keywords} distinct keywords per object"
        )
    return ((1 - q) - math.sqrt(disc)) / q


@functools.lru_cache(maxsize=4)
def _clusters(spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng((spec.seed, 0))
    lo = np.array(PAPER_BBOX[:2])
    hi = np.array(PAPER_BBOX[2:])
    centres = lo + rng.random((spec.clusters, 2)) * (hi - lo)
    weights = 1.0 / np.arange(1, spec.clusters + 1)
    sigma = np.exp(rng.uniform(np.log(0.02), np.log(0.5), size=spec.clusters))
    return centres, np.cumsum(weights) / weights.sum(), sigma


def synthetic_block(spec: SyntheticSpec, block: int) -> pd.DataFrame:
    """Objects ``block * BLOCK`` .. ``min(n, (block + 1) * BLOCK) - 1`` of the stream.

    Returns
    -------
    pandas.DataFrame
        ``id`` (str ``s<i>``), ``lon``, ``lat`` (float64 degrees inside :data:`PAPER_BBOX`),
        ``t`` (int64 epoch ms), ``keywords`` (sorted unique ``w<rank>`` strings).
    """
    first = block * BLOCK
    size = max(0, min(spec.n, first + BLOCK) - first)
    if size == 0:
        return pd.DataFrame({"id": pd.Series(dtype=object), "lon": pd.Series(dtype=np.float64),
                             "lat": pd.Series(dtype=np.float64), "t": pd.Series(dtype=np.int64),
                             "keywords": pd.Series(dtype=object)})
    rng = np.random.default_rng((spec.seed, 1, block))
    centres, cum_w, sigma = _clusters(spec)
    c = np.searchsorted(cum_w, rng.random(size))
    pts = centres[c] + rng.standard_normal((size, 2)) * sigma[c, None]
    lo, hi = np.array(PAPER_BBOX[:2]), np.array(PAPER_BBOX[2:])
    out = ((pts < lo) | (pts > hi)).any(axis=1)
    pts[out] = lo + rng.random((int(out.sum()), 2)) * (hi - lo)
    m = 1 + rng.poisson(poisson_rate(spec), size=size)
    ranks = np.searchsorted(_zipf_cdf(spec.vocabulary, spec.zipf_s), rng.random(int(m.sum()))) + 1
    owner = np.repeat(np.arange(size), m)
    order = np.lexsort((ranks, owner))
    ranks, owner = ranks[order], owner[order]
    keep = np.ones(ranks.size, dtype=bool)
    keep[1:] = (ranks[1:] != ranks[:-1]) | (owner[1:] != owner[:-1])
    words = np.char.add("w", ranks[keep].astype(str))
    # Sort each object's words as strings (w10 < w2), as ingest does.
    owner = owner[keep]
    words = words[np.lexsort((words, owner))]
    bounds = np.cumsum(np.bincount(owner, minlength=size))[:-1]
    ids = first + np.arange(size)
    return pd.DataFrame({
        "id": np.char.add("s", ids.astype(str)).astype(object),
        "lon": pts[:, 0], "lat": pts[:, 1],
        "t": spec.start_ms + ids.astype(np.int64) * spec.interval_ms,
        "keywords": [list(w) for w in np.split(words, bounds)],
    })


def ingest_synthetic(spec: SyntheticSpec, out_dir: str, *, grid_n: int = 128,
                     master: str = DEFAULT_MASTER) -> Manifest:
    """Generate the synthetic stream on Spark and write the ingest layout to ``out_dir``.

    The manifest has ``"kind": "synthetic"``, ``"synthetic": true`` and the parameters.
    """
    started = time.perf_counter()
    if grid_n < 1:
        raise InvalidArgumentError(f"--grid must be >= 1; got {grid_n}")
    out = check_output_dir(out_dir)
    # Large streams: more shuffle partitions and heap, so that the keyword aggregations of
    # 20 M objects (110 M pairs, 2.2 M keywords) fit (4 partitions in 4 GB ran out of memory).
    big = spec.n >= 5_000_000
    spark = spark_session(master, shuffle_partitions=max(4, spec.n // 250_000) if big else 4,
                          driver_memory="10g" if big else "4g")
    blocks = -(-spec.n // BLOCK)
    parts = blocks  # one block of 65,536 per partition: at 20 M objects, 8 partitions of 2.5 M ran the 4 GB JVM out of heap

    def generate(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            for b in batch["id"]:
                yield synthetic_block(spec, int(b))

    frame = (
        spark.range(0, blocks, numPartitions=parts)
        .mapInPandas(generate, "id string, lon double, lat double, t long, keywords array<string>")
        .select("id", "lon", "lat", "t", "keywords", F.lit(None).cast("string").alias("reason"),
                F.lit("synthetic").alias("source"), F.lit(None).cast("string").alias("raw"))
    )
    return write_outputs(frame, out, grid_n=grid_n, started=started, source=Inputs(
        "synthetic", [], {"stem": False, "with_names": False}, synthetic=True,
        description="SYNTHETIC stream shaped like the paper's Twitter data (Table 1); not real tweets",
        parameters={**asdict(spec), "bbox": list(PAPER_BBOX), "block": BLOCK, "poisson_rate": poisson_rate(spec)}))
