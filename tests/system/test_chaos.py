"""The chaos soak (:mod:`tests.system.chaos_soak`): ``knnmon serve --window 10m`` on a local
3-node Ray cluster at 1,000 objects/s with 1 % hostile entries, while a worker is SIGKILLed every
5 minutes, the service is SIGKILLed, Redis restarts and a node restarts. Its guarantees are
asserted; the latency and memory targets issue 66 set are asserted too, marked as not met on this
2-core machine (docs/performance.md, "Refill waves" and "The chaos soak"; strict: a run that meets
one fails until the mark is removed)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from tests.system import chaos_soak

pytestmark = pytest.mark.system

#: Seconds of publishing (default 30 minutes: the faults come at 12, 17 and 22 minutes).
CHAOS_S = float(os.environ.get("KNNMON_CHAOS_S", 1800))
NOT_MET = pytest.mark.xfail(reason="not met on 2 cores: refill waves, a replaced process's growth from its own start",
                            strict=True, raises=AssertionError)


@pytest.fixture(scope="module")
def report(system_data, tmp_path_factory) -> dict:
    objects, queries = system_data
    root = tmp_path_factory.mktemp("chaos")
    # (Ray's sockets live under the log folder: a Unix socket's path is at most 107 bytes)
    logs = tempfile.mkdtemp(prefix="knnmon-chaos-")
    try:
        assert chaos_soak.main(["--objects", objects, "--queries", queries, "--workers", "4",
                                "--duration-s", str(CHAOS_S), "--out", str(root / "chaos.json"),
                                "--log-dir", logs]) == 0
    except SystemExit as ex:  # (the soak's way to stop; a test's is an exception)
        raise RuntimeError(f"the chaos soak stopped: {ex}; logs in {logs}") from None
    return json.loads((root / "chaos.json").read_text())


def test_exact_after_every_fault_and_nothing_applied_twice(report):
    assert report["checks"], "no check ran"
    for c in report["checks"]:
        assert c["exact"] is True and c.get("applied_once") is True, c["label"]


def test_every_hostile_entry_is_rejected_with_its_reason(report):
    assert report["hostile"]["all_rejected_with_their_reason"] is True


def test_every_fault_is_served_again_and_every_revival_is_quick(report):
    assert all(e.get("served_again_s") is not None for e in report["events"]), report["events"]
    assert all(s <= 5.0 for s in report["revivals_s"]), report["revivals_s"]


def test_stream_lag_p99_within_5_s(report):
    assert report["summary"]["lag_ms_p99"] <= 5000


@NOT_MET
def test_latency_p99_within_1_s_in_every_minute_without_a_fault(report):
    met, of = map(int, report["summary"]["minutes_p99_le_1s_outside_faults"].split("/"))
    assert met == of


@NOT_MET
def test_memory_growth_below_5_percent_in_every_process(report):
    growth = report["summary"]["rss_growth_pct_per_process"]
    assert all(own < 5.0 for _role, _rss, own, *_ in growth.values()), growth
