"""Sliding windows over event time: the watermark, live and late objects (``SPEC.md``, "Semantics").

With a window of ``w`` ms, the **watermark** ``W`` is the largest ``t`` (epoch ms) of any object
applied so far, and an object is **live** while ``t > W - w``. After every batch each result is
the exact kNN over the live objects only. An object that arrives already expired
(``t <= W - w``, with ``W`` including its own batch) is **late**: not applied, counted (``run``)
or rejected with reason ``late`` (``serve``). The window follows Skype (Wang et al., VLDBJ 2017)
and Tornado: a time-based sliding window on the objects' own times.

Examples
--------
>>> parse_duration("90s"), parse_duration("15m"), parse_duration("2h"), parse_duration("7d")
(90000, 900000, 7200000, 604800000)
>>> w = Window(parse_duration("10s"))
>>> w.advance([5_000, 20_000]), w.watermark
(10000, 20000)
>>> w.late([9_000, 10_000, 10_001]).tolist()
[True, True, False]
"""

from __future__ import annotations

import re

import numpy as np

from knnmon.errors import InvalidArgumentError

__all__ = ["MAX_WINDOW_MS", "Window", "parse_duration"]

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

#: The longest window accepted: 10 years (a longer one is no window).
MAX_WINDOW_MS = 10 * 365 * 86_400_000


def parse_duration(text: str) -> int:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"`` or ``"250ms"`` as milliseconds (int, ``>= 1``).

    Raises
    ------
    InvalidArgumentError
        Not a number followed by one of ``ms s m h d``, zero, or longer than :data:`MAX_WINDOW_MS`.
    """
    m = _DURATION.match(str(text))
    if m is None:
        raise InvalidArgumentError(f"invalid duration {text!r}: write a number and a unit, e.g. 90s, 15m, 2h, 7d")
    ms = int(round(float(m.group(1)) * _UNITS[m.group(2)]))
    if not 1 <= ms <= MAX_WINDOW_MS:
        raise InvalidArgumentError(f"duration {text!r} must be between 1 ms and 10 years")
    return ms


class Window:
    """The watermark of one stream and the cutoff of its window (module docstring).

    Parameters
    ----------
    duration_ms
        The window's length, ms (``>= 1``).
    watermark
        The watermark to start from (epoch ms; a resumed service's), default: none yet.

    Attributes
    ----------
    watermark : int or None
        The largest ``t`` applied so far (``None`` before the first object).
    """

    def __init__(self, duration_ms: int, watermark: int | None = None) -> None:
        if not 1 <= int(duration_ms) <= MAX_WINDOW_MS:
            raise InvalidArgumentError(f"the window must be between 1 ms and 10 years; got {duration_ms} ms")
        self.duration_ms = int(duration_ms)
        self.watermark = None if watermark is None else int(watermark)

    @property
    def cutoff(self) -> int | None:
        """``W - window``: objects with ``t <=`` this are expired (``None`` before any object)."""
        return None if self.watermark is None else self.watermark - self.duration_ms

    def watermark_after(self, t) -> int | None:
        """The watermark once objects of times ``t`` (``(n,)`` int64 epoch ms) are applied:
        the largest of the current one and ``t`` (nothing moves)."""
        t = np.asarray(t, dtype=np.int64)
        if not len(t):
            return self.watermark
        top = int(t.max())
        return top if self.watermark is None else max(top, self.watermark)

    def cutoff_after(self, t) -> int | None:
        """:attr:`cutoff` once objects of times ``t`` are applied (nothing moves): objects at or
        below it are late in a batch of those times."""
        w = self.watermark_after(t)
        return None if w is None else w - self.duration_ms

    def advance(self, t) -> int | None:
        """Move the watermark to :meth:`watermark_after` ``t``; returns the new :attr:`cutoff`."""
        self.watermark = self.watermark_after(t)
        return self.cutoff

    def late(self, t) -> np.ndarray:
        """``(n,)`` bool: which of ``t`` (epoch ms) are expired at the current watermark."""
        t = np.asarray(t, dtype=np.int64)
        c = self.cutoff
        return np.zeros(len(t), dtype=bool) if c is None else t <= c

    def live(self, t) -> np.ndarray:
        """``(n,)`` bool: which of ``t`` are live (not :meth:`late`)."""
        return ~self.late(t)
