"""The synthetic Twitter-scale stream: Table 1 shape, determinism, labelled synthetic."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from knnmon.errors import InvalidArgumentError
from knnmon.ingest.output import RecordCounts
from knnmon.ingest.synthetic import BLOCK, PAPER_BBOX, SyntheticSpec, ingest_synthetic, synthetic_block


def test_block_shape_and_statistics():
    spec = SyntheticSpec(n=BLOCK + 1000, seed=3)
    b = synthetic_block(spec, 0)
    assert len(b) == BLOCK and len(synthetic_block(spec, 1)) == 1000 and len(synthetic_block(spec, 2)) == 0
    assert b.keywords.map(len).mean() == pytest.approx(5.51, abs=0.05)
    assert all(list(k) == sorted(set(k)) for k in b.keywords[:2000])
    assert b.lon.between(PAPER_BBOX[0], PAPER_BBOX[2]).all() and b.lat.between(PAPER_BBOX[1], PAPER_BBOX[3]).all()
    assert (np.diff(b.t) == spec.interval_ms).all()
    # Zipf-like: the most frequent word is far more common than the 100th.
    counts = pd.Series([w for k in b.keywords for w in k]).value_counts()
    assert counts.index[0] == "w1" and counts.iloc[0] > 20 * counts.iloc[99]
    # Clustered: the busiest 1 % of 0.5-degree cells hold far more than 1 % of the points.
    cells = pd.Series(list(zip((b.lon // 0.5).astype(int), (b.lat // 0.5).astype(int)))).value_counts()
    assert cells.iloc[: max(1, len(cells) // 100)].sum() > 0.1 * len(b)


def test_blocks_are_deterministic():
    spec = SyntheticSpec(n=5000, seed=11)
    assert synthetic_block(spec, 0).equals(synthetic_block(spec, 0))
    assert not synthetic_block(spec, 0).equals(synthetic_block(SyntheticSpec(n=5000, seed=12), 0))


def test_invalid_spec():
    with pytest.raises(InvalidArgumentError, match="synthetic n"):
        SyntheticSpec(n=0)
    with pytest.raises(InvalidArgumentError, match="cannot give"):
        from knnmon.ingest.synthetic import poisson_rate

        poisson_rate(SyntheticSpec(n=1, vocabulary=2, mean_keywords=5.0))


def test_ingest_writes_the_layout_labelled_synthetic(spark, tmp_path):
    spec = SyntheticSpec(n=20_000, seed=5)
    m = ingest_synthetic(spec, str(tmp_path), grid_n=32)
    assert m.source.synthetic is True and "SYNTHETIC" in m.source.description
    assert m.records == RecordCounts(read=20_000, kept=20_000, rejected=0)
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["synthetic"] is True and written["records"]["kept"] == 20_000 and "forms" not in written
    objects = pq.read_table(tmp_path / "objects.parquet").to_pandas()
    expected = synthetic_block(spec, 0)
    assert objects.sort_values("t").reset_index(drop=True)["id"].tolist() == expected["id"].tolist()
    assert [list(k) for k in objects.sort_values("t").keywords] == [list(k) for k in expected.keywords]
    stats = pq.read_table(tmp_path / "stats.parquet").to_pandas()
    assert stats["count"].sum() == expected.keywords.map(len).sum()
