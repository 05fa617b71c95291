"""knnmon's settings: one schema read from a TOML file, KNNMON_* variables and the flags;
``knnmon config`` says where each value came from; errors name the key and the valid values."""

from __future__ import annotations

import argparse
import os
import tomllib

import pytest

from knnmon.coordinator.cli import build_parser
from knnmon.coordinator.cli.settings import load_settings
from knnmon.errors import InvalidArgumentError
from tests.support import knnmon_cli

#: The most flags a verb may have (issue 65: ``knnmon serve --help`` fits on one screen).
MAX_FLAGS = 12


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _verbs(sub, (*path, name))
    if path:
        yield " ".join(path), [a for a in parser._actions if a.option_strings and not isinstance(a,
                       argparse._HelpAction)]


def test_no_verb_has_more_than_twelve_flags():
    counts = {verb: len(flags) for verb, flags in _verbs(build_parser())}
    assert {"serve", "run", "bench", "plan", "config"} <= set(counts)
    assert {verb: n for verb, n in counts.items() if n > MAX_FLAGS} == {}


def test_later_sources_win_and_config_says_where_each_value_came_from(tmp_path):
    (tmp_path / "knnmon.toml").write_text('[workers]\ncount = 4\nindex = "rtree"\n[window]\nsize = "15m"\n'
                                          '[serve]\nbatch = 300\n')
    env = {**os.environ, "KNNMON_WORKERS_INDEX": "grid", "KNNMON_SERVE_BATCH": "400",
           "KNNMON_REDIS_URL": "redis://:hunter2@127.0.0.1:1/0", "KNNMON_REDIS_CLUSTER_DIR": "/not/a/setting"}
    env.pop("KNNMON_CONFIG", None)
    p = knnmon_cli("config", "--set", "serve.batch=500", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    lines = {line.split("=")[0].strip(): line for line in p.stdout.splitlines() if "=" in line}
    assert lines["count"].startswith("count = 4") and "knnmon.toml" in lines["count"]  # the file over the default
    assert lines["index"].startswith('index = "grid"') and "$KNNMON_WORKERS_INDEX" in lines["index"]  # env over file
    assert lines["batch"].startswith("batch = 500") and "--set" in lines["batch"]  # the flag over both
    assert lines["size"].startswith('size = "15m"')
    assert lines["executor"].endswith("# default")
    assert "hunter2" not in p.stdout and "redis://:***@127.0.0.1:1/0" in p.stdout
    # what it prints is a config file of the same settings
    (tmp_path / "again.toml").write_text(p.stdout)
    again = load_settings(str(tmp_path / "again.toml")).settings
    assert again.workers.count == 4 and again.serve.batch == 500 and again.window.size == 900_000
    assert tomllib.loads(p.stdout)["workers"]["index"] == "grid"


@pytest.mark.parametrize(("text", "message"), [
    ('[workers]\ncont = 4\n', "unknown setting workers.cont ({path}); valid keys of [workers]: algorithm, count, "
                              "executor, index, ray_address"),
    ('[workers]\nexecutor = "k8s"\n', "workers.executor = 'k8s' ({path}): Input should be 'ray' or 'inline'"),
    ('[window]\nsize = "5 parsecs"\n', "window.size = '5 parsecs' ({path}): invalid duration"),
    ('[serve]\nmetrics = "nowhere"\n', "serve.metrics = 'nowhere' ({path}): --metrics must be HOST:PORT"),
    ('[wrokers]\ncount = 4\n', "unknown setting wrokers; valid sections: workers, redis"),
    ('workers = 4\n', "settings come in sections"),
    ('[workers\n', "not TOML"),
])
def test_a_bad_file_is_refused_naming_the_key_and_the_valid_values(tmp_path, monkeypatch, text, message):
    monkeypatch.delenv("KNNMON_SERVE_METRICS", raising=False)  # (conftest's: it would win over the file)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError) as ex:
        load_settings(str(path)).settings.serve_config()
    assert message.format(path=path) in str(ex.value)


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b'[workers]\ncount = "\xff\xfe"\n')
    with pytest.raises(InvalidArgumentError, match="binary.toml: not TOML"):
        load_settings(str(path))


def test_a_bad_variable_or_flag_is_refused_before_any_work(tmp_path):
    env = {**os.environ, "KNNMON_WORKERS_COUNT": "lots"}
    p = knnmon_cli("config", cwd=tmp_path, env=env)
    assert p.returncode == 2
    assert "workers.count = 'lots' ($KNNMON_WORKERS_COUNT): Input should be a valid integer" in p.stderr
    p = knnmon_cli("serve", "--set", "workers", cwd=tmp_path)
    assert p.returncode == 2 and "--set takes SECTION.KEY=VALUE" in p.stderr
    p = knnmon_cli("config", "--config", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert p.returncode == 2 and "--config: no such file" in p.stderr


def test_the_verbs_build_their_typed_configurations_from_one_settings_object(tmp_path):
    (tmp_path / "k.toml").write_text('[workers]\ncount = 3\nalgorithm = "space"\n[limits]\nmax_k = 50\n'
                                     '[rebalance]\nenabled = true\nwindow_batches = 7\n[redis]\nnamespace = "ns"\n')
    s = load_settings(str(tmp_path / "k.toml"), {"window.size": "2m", "serve.redis_wait_s": "5"}).settings
    serve = s.serve_config()
    assert (serve.run.workers, serve.run.algorithm, serve.run.limits.max_k) == (3, "space", 50)
    assert serve.run.rebalance.window == 7 and serve.run.window == 120_000 and serve.run.redis_wait_s == 5
    assert serve.run.store.namespace == "ns" and serve.run.store.durable and serve.run.initial == 0
    run = s.run_config()
    assert run.initial == 1_000_000 and not run.store.durable and run.overlap_writes


@pytest.mark.parametrize(("key", "value", "message"), [
    ("plan.delivery_cost", "inf", "Input should be a finite number"),
    ("serve.idle_exit_s", "nan", "Input should be a finite number"),
    ("rebalance.threshold", "nan", "Input should be a finite number"),
    ("workers.count", "9" * 40, "Input should be less than or equal to 64"),
    ("window.size", "99999d", "must be between 1 ms and 10 years"),
    ("limits.max_future", "-5s", "invalid duration"),
    ("redis.namespace", "", "at least 1 character"),
    ("workers.count.extra", "1", "unknown setting workers.count.extra"),
])
def test_hostile_values_are_refused_with_the_key(monkeypatch, tmp_path, key, value, message):
    monkeypatch.chdir(tmp_path)  # (no ./knnmon.toml)
    with pytest.raises(InvalidArgumentError) as ex:
        load_settings(None, {key: value})
    assert key in str(ex.value) and message in str(ex.value)
