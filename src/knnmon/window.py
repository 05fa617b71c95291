"""Event time: the watermark, live and late objects, and the bounds on an object's ``t``
(``docs/concepts.md``, "Semantics"; docs/serve.md, "Event time").

With a window of ``w`` ms and an allowed lateness of ``L`` ms (default 0), the **watermark**
``W`` is the largest ``t`` (epoch ms) of any object applied so far minus ``L``, and an object is
**live** while ``t > W - w``. After every batch each result is the exact kNN over the live objects
only. An object that arrives already expired (``t <= W - w``, with ``W`` including its own batch)
is **late**: not applied, counted (``run``) or rejected with reason ``late`` (``serve``). With
``L = 0`` the watermark is the largest ``t``; with ``L > 0`` it trails it by ``L``, as a
bounded-out-of-orderness watermark does in Flink: an object up to ``L`` behind the newest time
is still applied while it is live at that watermark. The window follows Skype (Wang et al.,
VLDBJ 2017) and Tornado: a time-based sliding window on the objects' own times.

Every ``t`` is also bounded from above: it may lead its **arrival time** (the stream entry id's
time in ``serve``, the ingest run's clock in ``ingest``, the wall clock in ``run``) by at most
``--max-future`` (:data:`DEFAULT_MAX_FUTURE_MS`), so that no single object moves the watermark
to the end of time (:func:`knnmon.limits.check_future`; the default, :data:`DEFAULT_MAX_FUTURE_MS`, lives in
:mod:`knnmon.limits` beside the other bounds on input).

Examples
--------
>>> parse_duration("90s"), parse_duration("15m"), parse_duration("2h"), parse_duration("7d")
(90000, 900000, 7200000, 604800000)
>>> w = Window(parse_duration("10s"))
>>> w.advance([5_000, 20_000]), w.watermark
(10000, 20000)
>>> w.late([9_000, 10_000, 10_001]).tolist()
[True, True, False]
>>> lax = Window(parse_duration("10s"), lateness_ms=parse_duration("5s", zero=True))
>>> lax.advance([20_000]), lax.watermark, lax.top
(5000, 15000, 20000)
"""

from __future__ import annotations

import re

import numpy as np

from knnmon.errors import InvalidArgumentError
from knnmon.limits import DEFAULT_MAX_FUTURE_MS

__all__ = ["DEFAULT_MAX_FUTURE_MS", "MAX_WINDOW_MS", "Window", "check_no_future", "live_mask", "parse_bound",
           "parse_duration"]

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

#: The longest window (and allowed lateness, and bound on the future) accepted: 10 years.
MAX_WINDOW_MS = 10 * 365 * 86_400_000
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1


def parse_duration(text: str, *, zero: bool = False) -> int:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"`` or ``"250ms"`` as milliseconds (int, ``>= 1``;
    ``>= 0`` with ``zero``, where a bare ``"0"`` is accepted too).

    Raises
    ------
    InvalidArgumentError
        Not a number followed by one of ``ms s m h d``, zero (unless ``zero``), or longer than
        :data:`MAX_WINDOW_MS`.
    """
    if zero and str(text).strip() == "0":
        return 0
    m = _DURATION.match(str(text))
    if m is None:
        raise InvalidArgumentError(f"invalid duration {text!r}: write a number and a unit, e.g. 90s, 15m, 2h, 7d")
    ms = int(round(float(m.group(1)) * _UNITS[m.group(2)]))
    if not (0 if zero else 1) <= ms <= MAX_WINDOW_MS:
        raise InvalidArgumentError(f"duration {text!r} must be between {0 if zero else 1} ms and 10 years")
    return ms


def parse_bound(text: str) -> int | None:
    """A bound such as ``--max-future``: ``"off"`` (no bound: ``None``) or a duration
    (:func:`parse_duration`, zero allowed), ms.

    Raises
    ------
    InvalidArgumentError
        Neither ``off`` nor a duration.
    """
    if str(text).strip().lower() == "off":
        return None
    return parse_duration(text, zero=True)


def _clamp(ms: int) -> int:
    """``ms`` inside int64 (a watermark near the ends of time stays comparable in numpy)."""
    return min(max(int(ms), _INT64_MIN), _INT64_MAX)


class Window:
    """The watermark of one stream and the cutoff of its window (module docstring).

    Parameters
    ----------
    duration_ms
        The window's length, ms (``1`` .. :data:`MAX_WINDOW_MS`).
    top
        The largest ``t`` applied so far to start from (epoch ms; a resumed service's or the
        initial objects'), default: none yet.
    lateness_ms
        The allowed lateness ``L``, ms (``0`` .. :data:`MAX_WINDOW_MS`; ``window.allowed_lateness``):
        the watermark trails :attr:`top` by this much.

    Attributes
    ----------
    top : int or None
        The largest ``t`` applied so far (``None`` before the first object).

    Raises
    ------
    InvalidArgumentError
        A length or lateness out of range.
    """

    def __init__(self, duration_ms: int, top: int | None = None, lateness_ms: int = 0) -> None:
        if not 1 <= int(duration_ms) <= MAX_WINDOW_MS:
            raise InvalidArgumentError(f"the window must be between 1 ms and 10 years; got {duration_ms} ms")
        if not 0 <= int(lateness_ms) <= MAX_WINDOW_MS:
            raise InvalidArgumentError(f"window.allowed_lateness must be between 0 and 10 years; got {lateness_ms} ms")
        self.duration_ms = int(duration_ms)
        self.lateness_ms = int(lateness_ms)
        self.top = None if top is None else int(top)

    @property
    def watermark(self) -> int | None:
        """``W``: :attr:`top` minus the allowed lateness, epoch ms (``None`` before any object)."""
        return None if self.top is None else _clamp(self.top - self.lateness_ms)

    @property
    def cutoff(self) -> int | None:
        """``W - window``: objects with ``t <=`` this are expired (``None`` before any object)."""
        return None if self.top is None else self._cutoff_of(self.top)

    def _cutoff_of(self, top: int) -> int:
        return _clamp(top - self.lateness_ms - self.duration_ms)

    def top_after(self, t) -> int | None:
        """:attr:`top` once objects of times ``t`` (``(n,)`` int64 epoch ms) are applied: the
        largest of the current one and ``t`` (nothing moves)."""
        t = np.asarray(t, dtype=np.int64)
        if not len(t):
            return self.top
        top = int(t.max())
        return top if self.top is None else max(top, self.top)

    def cutoff_after(self, t) -> int | None:
        """:attr:`cutoff` once objects of times ``t`` are applied (nothing moves): objects at or
        below it are late in a batch of those times."""
        top = self.top_after(t)
        return None if top is None else self._cutoff_of(top)

    def advance(self, t) -> int | None:
        """Move :attr:`top` to :meth:`top_after` ``t``; returns the new :attr:`cutoff`."""
        self.top = self.top_after(t)
        return self.cutoff

    def late(self, t) -> np.ndarray:
        """``(n,)`` bool: which of ``t`` (epoch ms) are expired at the current watermark."""
        t = np.asarray(t, dtype=np.int64)
        c = self.cutoff
        return np.zeros(len(t), dtype=bool) if c is None else t <= c

    def live(self, t) -> np.ndarray:
        """``(n,)`` bool: which of ``t`` are live (not :meth:`late`)."""
        return ~self.late(t)


def live_mask(t, window_ms: int, lateness_ms: int = 0) -> np.ndarray:
    """``(n,)`` bool: which of the times ``t`` (``(n,)`` int64 epoch ms) are live at their own
    watermark (the largest of them minus ``lateness_ms``) with a window of ``window_ms``: the
    objects a run or a recovered service starts from."""
    t = np.asarray(t, dtype=np.int64)
    if not len(t):
        return np.zeros(0, dtype=bool)
    return Window(window_ms, int(t.max()), lateness_ms).live(t)


def check_no_future(ids, t, clock_ms: int, max_future_ms: int | None, what: str = "the stream") -> None:
    """Refuse objects whose times ``t`` (``(n,)`` int64 epoch ms; ids ``ids``, ``(n,)``) lead
    the clock ``clock_ms`` (epoch ms; ``knnmon run``'s is the wall clock) by more than
    ``max_future_ms`` (``None``: no bound).

    Raises
    ------
    InvalidArgumentError
        Naming the object furthest ahead, how many are ahead, and ``--max-future off``.
    """
    t = np.asarray(t, dtype=np.int64)
    if max_future_ms is None or not len(t):
        return
    ahead = t.astype(object) - clock_ms > max_future_ms  # Python ints: no overflow near the ends of time
    if not ahead.any():
        return
    i = int(np.argmax(t))
    raise InvalidArgumentError(
        f"{what} holds {int(ahead.sum()):,} object(s) from the future: object {ids[i]!r} has t={int(t[i])}, "
        f"{int(t[i]) - clock_ms:,} ms ahead of the clock ({clock_ms}), more than --max-future "
        f"{max_future_ms:,} ms (with a window it would expire every object before it at once); pass --max-future "
        "off for data whose times lie ahead on purpose (a synthetic or shifted stream)")
