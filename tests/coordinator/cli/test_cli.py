"""The ``knnmon`` command line: exit codes and messages, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from knnmon.coordinator.cli import main
from tests.support import knnmon_cli


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return knnmon_cli(*args, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_missing_path_is_a_clear_error_before_spark(tmp_path):
    code = ("import sys; from knnmon.coordinator.cli import main; from pyspark import SparkContext\n"
            f"rc = main(['ingest', 'places', {str(tmp_path / 'nope.gz')!r}, '--out', {str(tmp_path / 'o')!r}])\n"
            "print('spark started' if SparkContext._active_spark_context else 'no spark'); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "input path does not exist" in p.stderr and "nope.gz" in p.stderr
    assert p.stdout.strip() == "no spark"
    assert not (tmp_path / "o").exists()


def test_unreadable_and_empty_inputs(tmp_path):
    (tmp_path / "corrupt.geojson.gz").write_bytes(b"this is not gzip")
    (tmp_path / "empty").mkdir()
    p = run_cli("ingest", "places", str(tmp_path / "corrupt.geojson.gz"), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "cannot read input file" in p.stderr
    p = run_cli("ingest", "tweets", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "input directory has no files" in p.stderr


def test_usage_errors():
    p = run_cli("ingest", "places")
    assert p.returncode == 2 and "PATH" in p.stderr
    p = run_cli("frobnicate")
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_ingest_and_generate_through_the_cli(spark, place_lines, tmp_path, capsys):
    (tmp_path / "dc.geojson").write_text("\n".join(place_lines("dc", 664)) + "\n")
    assert main(["ingest", "places", str(tmp_path / "dc.geojson"),
                 "--out", str(tmp_path / "dc"), "--grid", "8"]) == 0
    out = capsys.readouterr().out
    assert "places: read" in out and "distinct keywords" in out
    assert main(["queries", "generate", "--objects", str(tmp_path / "dc"), "--n", "50", "--kmax", "4",
                 "--seed", "2", "--out", str(tmp_path / "q.parquet")]) == 0
    assert pq.read_table(tmp_path / "q.parquet").num_rows == 50
    assert main(["queries", "generate", "--objects", str(tmp_path / "dc"), "--n", "10000000", "--kmax", "4",
                 "--out", str(tmp_path / "q2.parquet")]) == 2
    assert "cannot seed 10000000 queries" in capsys.readouterr().err
    assert not Path(tmp_path / "q2.parquet").exists()


def test_run_rejects_bad_numbers_before_any_work(places_slice, tmp_path, capsys):
    base = ["run", "--objects", str(places_slice), "--queries", str(tmp_path / "none.parquet")]
    for flag, value, message in (("--set", "run.in_flight=0", "run.in_flight = '0' (--set): Input should be greater "
                                                              "than or equal to 1"),
                                 ("--workers", "0", "workers.count = '0' (--workers): Input should be greater than"),
                                 ("--set", "run.batch=0", "run.batch = '0' (--set)")):
        assert main([*base, flag, value]) == 2
        assert message in capsys.readouterr().err
    assert main([*base, "--set", "rebalance.enabled=true", "--set", "rebalance.budget=2"]) == 2
    assert "rebalance.budget = '2' (--set): Input should be less than or equal to 1" in capsys.readouterr().err


def test_every_verb_has_a_description_and_every_flag_a_help():
    import argparse

    from knnmon.coordinator.cli import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if not sub.description:
                        missing.append(" ".join([*path, name]))
                    walk(sub, [*path, name])
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(" ".join([*path, *(action.option_strings or [action.dest])]))

    walk(build_parser(), [])
    assert missing == []
    p = run_cli("serve", "--help")
    assert "(default 2)" in p.stdout and "(default 127.0.0.1:9464)" in p.stdout  # defaults shown


def test_serve_rejects_bad_batching_flags_before_touching_redis(capsys):
    base = ["serve", "--redis", "redis://127.0.0.1:1/0"]  # nothing listens there: refused first
    for extra, message in ((["--set", "serve.latency_target_ms=nan"], "serve.latency_target_ms = 'nan' (--set): "
                                                                      "Input should be a finite number"),
                           (["--set", "serve.latency_target_ms=-5"], "Input should be greater than 0"),
                           (["--set", "serve.max_delay_ms=inf"], "serve.max_delay_ms = 'inf'"),
                           (["--set", "workers.index=quadtree"], "workers.index = 'quadtree' (--set): Input should "
                                                                 "be 'grid' or 'rtree'")):
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err


def test_a_cold_kernel_cache_is_announced_once_warm_it_is_not(tmp_path, monkeypatch):
    """The first start on a machine compiles every kernel (about a minute, silent otherwise):
    run, demo and serve say so while numba's cache holds no index of the workers' kernels."""
    from knnmon.coordinator.cli.options import announce_first_compile

    said: list[str] = []
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    announce_first_compile(said.append)
    assert len(said) == 1 and "compiling knnmon's kernels" in said[0] and str(tmp_path) in said[0]
    (tmp_path / "workers_0123").mkdir()
    (tmp_path / "workers_0123" / "kernels.grid_hits-12.py311.nbi").write_bytes(b"")
    announce_first_compile(said.append)
    assert len(said) == 1
