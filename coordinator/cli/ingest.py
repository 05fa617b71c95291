"""``knnmon ingest places|tweets|synthetic``: raw data -> objects, statistics, rejects (on Spark)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from knnmon.coordinator.cli.options import add_config_options, add_verb, setting_flag, settings_of
from knnmon.grid import DEFAULT_GRID
from knnmon.ingest.spark import DEFAULT_MASTER, require_spark

if TYPE_CHECKING:  # (the ingest's modules load pyspark: only the ingest's verbs need it)
    from knnmon.ingest.output import Manifest

__all__ = ["add_ingest_commands", "format_manifest"]


def format_manifest(m: Manifest) -> str:
    """A short human-readable summary of an ingest manifest."""
    rec = m.records
    lines = [
        f"{m.source.kind}{' (SYNTHETIC)' if m.source.synthetic else ''}: "
        f"read {rec.read:,}  kept {rec.kept:,}  rejected {rec.rejected:,}",
    ]
    for reason, n in rec.rejected_by_reason.items():
        lines.append(f"  rejected {reason:<26} {n:>10,}")
    lines.append(f"distinct keywords {m.distinct_keywords:,}; keywords per object {m.mean_keywords_per_object:.2f}")
    if m.bbox:
        b, n = m.bbox, m.grid["n"]
        lines.append(f"bbox lon [{b[0]:.4f}, {b[2]:.4f}] lat [{b[1]:.4f}, {b[3]:.4f}]; grid {n}x{n}")
    lines.append(f"elapsed {m.elapsed_s:.1f} s")
    return "\n".join(lines)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--grid", type=int, default=DEFAULT_GRID, metavar="N",
                   help=f"statistics grid: N x N cells over the data's bounding box (default {DEFAULT_GRID})")
    p.add_argument("--master", default=DEFAULT_MASTER, help=f"Spark master URL (default {DEFAULT_MASTER})")


def _bounds(p: argparse.ArgumentParser) -> None:
    setting_flag(p, "--max-future", "limits.max_future", metavar="DURATION",
                 help="reject records whose time leads the ingest run's clock by more than DURATION; off: no bound")
    add_config_options(p)


def _run_places(a: argparse.Namespace) -> int:
    require_spark()
    from knnmon.ingest.jobs import ingest_places

    print(format_manifest(ingest_places(a.paths, a.out, grid_n=a.grid, master=a.master,
                                        with_names=a.with_names, stem=a.stem,
                                            max_future_ms=settings_of(a).settings.limits.max_future)))
    return 0


def _run_tweets(a: argparse.Namespace) -> int:
    require_spark()
    from knnmon.ingest.jobs import ingest_tweets

    print(format_manifest(ingest_tweets(a.paths, a.out, grid_n=a.grid, master=a.master, stem=a.stem,
                                        max_future_ms=settings_of(a).settings.limits.max_future)))
    return 0


def _run_synthetic(a: argparse.Namespace) -> int:
    require_spark()
    from knnmon.ingest.synthetic import SyntheticSpec, ingest_synthetic

    spec = SyntheticSpec(n=a.n, vocabulary=a.vocabulary, mean_keywords=a.mean_keywords, zipf_s=a.zipf,
                         clusters=a.clusters, seed=a.seed)
    print(format_manifest(ingest_synthetic(spec, a.out, grid_n=a.grid, master=a.master)))
    return 0


def add_ingest_commands(sub: Any) -> None:
    """Register ``ingest places|tweets|synthetic`` on a root parser's subparsers."""
    ingest = add_verb(sub, "ingest", "preprocess raw data on Spark into objects, statistics, rejects")
    kinds = ingest.add_subparsers(dest="kind", required=True, metavar="{places,tweets,synthetic}")

    p = add_verb(kinds, "places", "SimpleGeo GeoJSON lines (.geojson[.gz])")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    _common(p)
    p.add_argument("--with-names", action="store_true", help="also take keywords from place names")
    p.add_argument("--stem", action="store_true", help="Snowball-stem keywords")
    _bounds(p)
    p.set_defaults(func=_run_places)

    t = add_verb(kinds, "tweets", "tweet CSV (id,username,created_at,lng,lat,text) or API v1.1 JSON lines")
    t.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    _common(t)
    t.add_argument("--stem", action="store_true", help="Snowball-stem keywords")
    _bounds(t)
    t.set_defaults(func=_run_tweets)

    s = add_verb(kinds, "synthetic", "SYNTHETIC Twitter-scale stream shaped like the paper's Table 1")
    s.add_argument("--n", type=int, required=True, help="number of objects (paper: 20,000,000)")
    _common(s)
    s.add_argument("--vocabulary", type=int, default=2_225_654, help="vocabulary size (default 2,225,654)")
    s.add_argument("--mean-keywords", type=float, default=5.51, help="distinct keywords per object (default 5.51)")
    s.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of keyword frequencies (default 1.0)")
    s.add_argument("--clusters", type=int, default=1000, help="location clusters (default 1000)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the synthetic stream")
    s.set_defaults(func=_run_synthetic)
