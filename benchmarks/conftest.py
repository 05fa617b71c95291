"""knnmon's benchmark suite (pytest-benchmark): the paper's experiments, the end-to-end speed of
``run`` and ``serve`` beside the single-process reference, and micro-benchmarks.

    python -m pytest benchmarks                        # the smoke scale: the bundled sample, minutes
    KNNMON_BENCH_SCALE=paper KNNMON_BENCH_OBJECTS=/tmp/full_default python -m pytest benchmarks \\
        --benchmark-json=bench.json                     # the paper's sizes on the 1.42 M places

``KNNMON_BENCH_OBJECTS`` is an ingest output (default: the package's bundled places sample,
ingested once on Spark into ``~/.cache/knnmon/bench-sample``). Each benchmark puts the figures the
docs quote (update time per batch, load imbalance, objects/s, exactness) in its
``extra_info``; pytest-benchmark's own time is the call's wall time. The default tests run the
suite once at the smoke scale with ``--benchmark-disable`` (``tests/test_benchmark_suite.py``), so
that it cannot rot. docs/performance.md says which figures come from which benchmark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Scale:
    """The sizes of one scale: ``queries`` drawn with ``k`` uniform in ``[1, kmax]``, ``initial``
    objects before the stream, ``batches`` of 1,000, ``workers`` where W is not swept; the
    experiments' sweeps (over
    ``sweep_algorithms``; the smoke scale runs one); ``check_sample`` queries checked against the
    brute-force oracle; ``executor``: where the runs outside the paper's experiments put their
    workers (the smoke scale: in process, to stay quick)."""

    queries: int
    kmax: int
    initial: int
    batches: int
    workers: int
    workers_sweep: tuple[int, ...]
    kmax_sweep: tuple[int, ...]
    queries_sweep: tuple[int, ...]
    check_sample: int
    sweep_algorithms: tuple[str, ...]
    executor: str = "ray"


SCALES = {
    "smoke": Scale(queries=2_000, kmax=5, initial=3_000, batches=2, workers=2, workers_sweep=(2,), kmax_sweep=(5,),
                   queries_sweep=(1_000,), check_sample=100, sweep_algorithms=("proposed",), executor="inline"),
    # the paper's (Tsuruoka et al. 2019, §5, Table 2), on the 1.42 M places (docs/benchmarks.md)
    "paper": Scale(queries=100_000, kmax=10, initial=1_000_000, batches=60, workers=12, workers_sweep=(4, 8, 12, 16,
                   20, 24),
                   kmax_sweep=(5, 10, 15, 20), queries_sweep=(100_000, 300_000, 1_000_000), check_sample=2_000,
                   sweep_algorithms=("proposed", "keyword", "space", "random")),
    # the paper's largest setting: 3 M queries over 20 M synthetic Twitter-shaped objects
    # (`knnmon ingest synthetic --n 20000000`; docs/performance.md, "The paper's scale")
    "twitter": Scale(queries=3_000_000, kmax=10, initial=1_000_000, batches=50, workers=12, workers_sweep=(12, 24),
                     kmax_sweep=(10,), queries_sweep=(1_000_000, 2_000_000, 3_000_000), check_sample=2_000,
                     sweep_algorithms=("proposed", "random")),
}
SCALE = SCALES[os.environ.get("KNNMON_BENCH_SCALE", "smoke")]


@pytest.fixture(scope="session")
def scale() -> Scale:
    return SCALE


@pytest.fixture(scope="session")
def objects_dir() -> str:
    """An ingest output: ``$KNNMON_BENCH_OBJECTS``, else the bundled sample ingested once."""
    given = os.environ.get("KNNMON_BENCH_OBJECTS")
    if given:
        return given
    out = Path.home() / ".cache" / "knnmon" / "bench-sample"
    if not (out / "manifest.json").exists():
        from importlib.resources import files

        from knnmon.ingest.jobs import ingest_places

        ingest_places([str(files("knnmon.data") / "places-sample-ri.geojson.gz")], str(out))
    return str(out)


@pytest.fixture(scope="session")
def queries_file(objects_dir, scale, tmp_path_factory) -> str:
    """``scale.queries`` queries drawn from the objects (seed 0), as a query file."""
    from knnmon.ingest.queries import QueryWorkload, generate_queries, write_queries
    from knnmon.ingest.reading import read_objects

    path = tmp_path_factory.mktemp("queries") / "queries.parquet"
    write_queries(generate_queries(read_objects(objects_dir), QueryWorkload(n=scale.queries, k_max=scale.kmax, seed=0)),
                  str(path))
    return str(path)


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for the session (the runs join it instead of starting their own)."""
    from knnmon.coordinator.runtime.ray_start import init_ray, shutdown_ray

    started = init_ray()
    yield
    if started:
        shutdown_ray()


@pytest.fixture(scope="session")
def redis_url():
    """An embedded redis-server for the session."""
    from knnmon.redis_server import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url
