"""The window's watermark, durations and late objects (knnmon.window), and its flags' checks."""

from __future__ import annotations

import pytest

from knnmon.coordinator.runtime.config import DEFAULT_RESERVE, RunConfig
from knnmon.errors import InvalidArgumentError
from knnmon.window import Window, parse_duration


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
    assert Window(10_000, watermark=50_000).cutoff == 40_000


def test_run_config_checks_the_window_and_the_reserve():
    assert RunConfig(window=60_000).places_reserved == DEFAULT_RESERVE
    assert RunConfig().places_reserved == 0 and RunConfig(window=60_000, reserve=0).places_reserved == 0
    for bad in ({"window": 0}, {"reserve": -1}, {"reserve": 1001}, {"arrival_ms": 0}, {"arrival_ms": 2**62}):
        with pytest.raises(InvalidArgumentError):
            RunConfig(**bad)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_serve_rejects_a_checkpoint_interval_that_never_fires(interval):
    from knnmon.coordinator.service.config import ServeConfig

    with pytest.raises(InvalidArgumentError, match="checkpoint-interval"):
        ServeConfig(window=60_000, checkpoint_interval_s=interval)
