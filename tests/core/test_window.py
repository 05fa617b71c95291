"""The window's watermark, durations and late objects (knnmon.window), and its flags' checks."""

from __future__ import annotations

import pytest

from knnmon.coordinator.runtime.config import DEFAULT_RESERVE, RunConfig
from knnmon.errors import InvalidArgumentError
from knnmon.window import Window, check_no_future, live_mask, parse_bound, parse_duration


@pytest.mark.parametrize("text, ms", [("90s", 90_000), ("15m", 900_000), ("2h", 7_200_000), ("7d", 604_800_000),
                                      ("250ms", 250), (" 1.5h ", 5_400_000)])
def test_durations(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "5", "5x", "-5s", "0s", "11000d", "s", "1e3s", "5 s s"])
def test_bad_durations_are_clear_errors(text):
    with pytest.raises(InvalidArgumentError, match="duration"):
        parse_duration(text)


def test_watermark_moves_forward_only_and_late_is_at_or_below_the_cutoff():
    w = Window(10_000)
    assert w.cutoff is None and not w.late([0]).any()
    assert w.advance([5_000, 20_000]) == 10_000
    assert w.advance([15_000]) == 10_000  # an older batch does not move it back
    assert w.late([9_999, 10_000, 10_001]).tolist() == [True, True, False]
    assert Window(10_000, top=50_000).cutoff == 40_000


def test_allowed_lateness_makes_the_watermark_trail_the_largest_t():
    w = Window(10_000, lateness_ms=3_000)
    assert w.advance([20_000]) == 7_000 and w.watermark == 17_000 and w.top == 20_000
    # 3 s behind the cutoff a lateness of 0 would have: still live
    assert w.late([7_000, 7_001, 9_999]).tolist() == [True, False, False]
    assert Window(10_000).cutoff_after([20_000]) == 10_000  # lateness 0: today's semantics
    assert live_mask([1, 8_000, 20_000], 10_000, 3_000).tolist() == [False, True, True]
    assert live_mask([1, 8_000, 20_000], 10_000).tolist() == [False, False, True]


@pytest.mark.parametrize("t", [2**63 - 1, -2**63, 9_000_000_000_000_000_000])
def test_times_at_the_ends_of_int64_keep_the_cutoff_comparable(t):
    w = Window(10_000, lateness_ms=5_000)
    cutoff = w.advance([t])
    assert -2**63 <= cutoff <= 2**63 - 1 and -2**63 <= w.watermark <= 2**63 - 1
    assert w.late([t]).dtype == bool


@pytest.mark.parametrize("text, ms", [("off", None), ("OFF", None), ("0", 0), ("0s", 0), ("1m", 60_000),
                                      ("90s", 90_000)])
def test_bounds(text, ms):
    assert parse_bound(text) == ms


@pytest.mark.parametrize("text", ["", "of", "-1m", "never"])
def test_bad_bounds_are_clear_errors(text):
    with pytest.raises(InvalidArgumentError, match="duration"):
        parse_bound(text)


def test_a_stream_from_the_future_is_refused_naming_the_object():
    now = 1_800_000_000_000
    check_no_future(["a", "b"], [now - 5, now + 60_000], now, 60_000)  # at the bound: fine
    check_no_future(["a", "b"], [now, 9_000_000_000_000_000_000], now, None)  # off
    with pytest.raises(InvalidArgumentError, match=r"1 object\(s\) from the future: object 'b'.*--max-future off"):
        check_no_future(["a", "b"], [now, 9_000_000_000_000_000_000], now, 60_000)


def test_allowed_lateness_needs_a_window_and_a_range():
    assert RunConfig(window=60_000, allowed_lateness=5_000).allowed_lateness == 5_000
    with pytest.raises(InvalidArgumentError, match="needs --window"):
        RunConfig(allowed_lateness=5_000)
    with pytest.raises(InvalidArgumentError, match="allowed_lateness"):
        RunConfig(window=60_000, allowed_lateness=-1)


def test_run_config_checks_the_window_and_the_reserve():
    assert RunConfig(window=60_000).places_reserved == DEFAULT_RESERVE
    assert RunConfig().places_reserved == 0 and RunConfig(window=60_000, reserve=0).places_reserved == 0
    for bad in ({"window": 0}, {"reserve": -1}, {"reserve": 1001}, {"arrival_ms": 0}, {"arrival_ms": 2**62}):
        with pytest.raises(InvalidArgumentError):
            RunConfig(**bad)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_serve_rejects_a_checkpoint_interval_that_never_fires(interval):
    from knnmon.coordinator.service.config import ServeConfig

    with pytest.raises(InvalidArgumentError, match="checkpoint_interval_s"):
        ServeConfig(run=RunConfig(window=60_000), checkpoint_interval_s=interval)
