"""The soak: ``knnmon serve --window 2m`` under a steady stream, the service SIGKILLed halfway
(:mod:`tests.system.soak`); its thresholds asserted."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.system import soak

pytestmark = pytest.mark.system

#: Seconds of publishing (default 10 minutes).
SOAK_S = float(os.environ.get("KNNMON_SOAK_S", 600))


@pytest.fixture(scope="module")
def report(system_data, tmp_path_factory) -> dict:
    objects, queries = system_data
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    try:
        assert soak.main(["--objects", objects, "--queries", queries, "--queries-n", "100000", "--rate", "1000",
                          "--duration-s", str(SOAK_S), "--kill-at-s", str(SOAK_S / 2), "--catch-up-s", "600",
                          "--check", "2000", "--out", str(out)]) == 0
    except SystemExit as ex:  # (the soak's way to stop; a test's is an exception)
        raise RuntimeError(f"the soak stopped: {ex}") from None
    return json.loads(out.read_text())


def test_every_result_is_exact_and_every_entry_applied(report):
    assert report["drained"] is True
    assert report["exact"] is True


def test_a_sigkilled_service_catches_up(report):
    (restart,) = report["restarts"]
    assert restart["caught_up_s"] is not None and restart["caught_up_s"] <= 120, restart


def _steady(report: dict) -> list[dict]:
    """The samples once the window has filled (2 minutes: the preload's expiry is a refill wave
    issue 66 is about) and outside the restart, from the kill to a minute after it caught up."""
    (restart,) = report["restarts"]
    caught_up = restart["at_s"] + (restart["caught_up_s"] or SOAK_S)
    return [s for s in report["samples"] if s["latency_ms_p99"] is not None and s["t_s"] >= 120
            and not restart["at_s"] <= s["t_s"] <= caught_up + 60]


def test_most_samples_answer_within_a_second(report):
    """The median of the 10 s samples' p99 (XADD -> acknowledged) is within 1 s."""
    steady = _steady(report)
    assert steady and np.median([s["latency_ms_p99"] for s in steady]) <= 1000, steady


@pytest.mark.xfail(reason="issue 66: refill waves", strict=True, raises=AssertionError)
def test_every_sample_answers_within_a_second(report):
    assert all(s["latency_ms_p99"] <= 1000 for s in _steady(report))


def test_memory_does_not_grow_with_time(report):
    """Redis and the service hold a window, not a history: the largest memory of the last two
    minutes is within 10 % of the largest of the two minutes after the restart settled (two
    checkpoint periods each: the objects stream grows between checkpoints)."""
    (restart,) = report["restarts"]
    settled = restart["at_s"] + (restart["caught_up_s"] or SOAK_S) + 60
    if SOAK_S < settled + 240:
        pytest.skip("too short a soak for two settled stretches of two minutes")
    after = [s for s in report["samples"] if settled <= s["t_s"] < settled + 120]
    last = [s for s in report["samples"] if s["t_s"] >= SOAK_S - 120]
    for key in ("redis_used_memory_mb", "service_rss_mb"):
        a = max(s[key] for s in after if s[key])
        b = max(s[key] for s in last if s[key])
        assert b <= 1.10 * a, (key, a, b)
