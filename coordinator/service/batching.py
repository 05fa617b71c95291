"""How ``knnmon serve`` forms batches: when to wait, how big a (mini)batch is, in which order.

Policies (``serve.batching``):

- ``fixed``: after a read's first object, wait up to ``serve.max_delay_ms`` for more (knnmon's first
  policy; a lone object always waits the delay);
- ``no-wait``: never wait; a batch is what one read returns, i.e. what queued while the
  previous batch ran (an idle service answers an object at once);
- ``adaptive`` (Fischer & Kossmann, ICDE 2005, §7 "adaptive batching"): no wait either, and a
  read is cut into **minibatches** whose size follows the measured arrival rate and cost per
  object, each processed and acknowledged (its results released) before the next:

  - the cost of a minibatch of ``m`` objects is fitted online as ``T(m) = a + b m`` (least
    squares over the last :data:`FIT_BATCHES` minibatches);
  - **latency**: an object that arrives while a minibatch runs waits for it and then for its
    own, about ``2 T(m)``; ``2 T(m) <= serve.latency_target_ms`` gives ``m_lat = (target / 2 - a) / b``
    (FK §7.2: ``batchsize < acceptable_latency / (1/rate + matching_single/speedup)``);
  - **throughput**: minibatches must keep up with the arrival rate ``r`` (objects/s over the last
    :data:`RATE_WINDOW_S` s): ``m / T(m) >= r`` gives ``m_thr = r a / (1 - r b)``, and when
    ``r b`` nears 1 the service is saturated and takes whole reads (``serve.batch``): FK, "switch to
    batching during bursts; messages are queued then, so batching adds no latency";
  - ``m = max(m_lat, m_thr)``, at least 1 and at most ``serve.batch``; a read of ``n <= m`` objects is
    one batch, one of ``n > m`` is cut into ``ceil(n / m)`` minibatches of equal size (FK's
    fixed-number cut: no tiny tail);
  - a **backlog** (a read that came back full: more is queued) is processed in batches of
    ``serve.batch``: the objects waited already, and small minibatches would only lower the
    throughput that drains the backlog;
  - a read whose first minibatches ran slower than the arrival rate (``r T / m >= 0.8`` over
    the minibatches done, :meth:`BatchPolicy.regroup`) has **the rest in one batch**: the cost
    varies with the region a stream is in (a dense region's minibatch costs 3-10x a sparse
    one's, mostly fixed), so a fit over the last minibatches can cut a read too fine for a dense
    one, and each minibatch's fixed cost then falls behind the stream (FK: batching during
    bursts).

Short-Job-First minibatches (Wang, Zhang and Kitsuregawa) are not built: a minibatch's results
are released together, and ordering a burst by each object's candidates, counted by the workers
in one more call per read, made bursts slower on this service (docs/batching.md).
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from knnmon.errors import InvalidArgumentError

__all__ = ["FIT_BATCHES", "POLICIES", "RATE_WINDOW_S", "BatchPolicy"]

#: ``serve.batching`` choices.
POLICIES = ("fixed", "no-wait", "adaptive")
#: Minibatches in the cost fit.
FIT_BATCHES = 64
#: Seconds of reads in the arrival rate.
RATE_WINDOW_S = 2.0
#: ``r b`` above this counts as saturated (whole reads).
SATURATED = 0.8


class BatchPolicy:
    """The service's batching policy (module docstring).

    Parameters
    ----------
    policy
        One of :data:`POLICIES`.
    batch
        The largest batch (``serve.batch``): a read takes at most this many entries.
    max_delay_ms
        ``fixed`` only: the wait for more after a read's first object (ms).
    latency_target_ms
        ``adaptive`` only: the target for an object's time from publish to result (ms).

    Raises
    ------
    InvalidArgumentError
        An unknown policy, ``batch < 1``, a negative or infinite delay, or a target that is not a
        positive finite number.
    """

    def __init__(self, policy: str = "adaptive", *, batch: int = 1000, max_delay_ms: float = 20.0,
                 latency_target_ms: float = 50.0) -> None:
        if policy not in POLICIES:
            raise InvalidArgumentError(f"Invalid serve.batching: {policy!r}.\nValid options are: {POLICIES}")
        if batch < 1:
            raise InvalidArgumentError(f"serve.batch must be >= 1; got {batch}")
        if not (math.isfinite(max_delay_ms) and max_delay_ms >= 0):
            raise InvalidArgumentError(f"serve.max_delay_ms must be a finite number >= 0; got {max_delay_ms}")
        if not (math.isfinite(latency_target_ms) and latency_target_ms > 0):
            raise InvalidArgumentError(f"serve.latency_target_ms must be a finite number > 0; got {latency_target_ms}")
        self.policy, self.batch = policy, int(batch)
        self.max_delay_ms, self.latency_target_ms = float(max_delay_ms), float(latency_target_ms)
        self._costs: deque[tuple[int, float]] = deque(maxlen=FIT_BATCHES)  # (objects, seconds)
        self.regrouped = 0  # reads whose rest went in one batch (regroup)
        self._reads: deque[tuple[float, int]] = deque()  # (monotonic time, objects read)

    @property
    def wait_ms(self) -> float:
        """How long to wait for more objects after a read's first (ms): 0 but for ``fixed``."""
        return self.max_delay_ms if self.policy == "fixed" else 0.0

    def read(self, n: int, now: float | None = None) -> None:
        """Note ``n`` objects read now (for the arrival rate)."""
        now = time.monotonic() if now is None else now
        self._reads.append((now, int(n)))
        while self._reads and now - self._reads[0][0] > RATE_WINDOW_S:
            self._reads.popleft()

    def observe(self, n: int, seconds: float) -> None:
        """Note that a minibatch of ``n`` objects took ``seconds`` from start to acknowledgement."""
        if n > 0 and math.isfinite(seconds) and seconds >= 0:
            self._costs.append((int(n), float(seconds)))

    def rate(self, now: float | None = None) -> float:
        """Objects read per second over the last :data:`RATE_WINDOW_S` seconds."""
        now = time.monotonic() if now is None else now
        recent = [n for t, n in self._reads if now - t <= RATE_WINDOW_S]
        return sum(recent) / RATE_WINDOW_S

    def cost(self) -> tuple[float, float] | None:
        """The fitted ``(a, b)`` of ``T(m) = a + b m`` in seconds, or ``None`` before any minibatch."""
        if not self._costs:
            return None
        m = np.array([c[0] for c in self._costs], dtype=np.float64)
        t = np.array([c[1] for c in self._costs], dtype=np.float64)
        if len(m) >= 4 and m.std() > 0.1 * max(m.mean(), 1.0):
            b, a = np.polyfit(m, t, 1)
            if a >= 0 and b > 0:
                return float(a), float(b)
        # Sizes too alike (or a fit with a negative part): the cheapest minibatch as the fixed
        # cost, the rest spread over the objects.
        a = float(t.min())
        b = max(float((t.mean() - a) / m.mean()), 1e-7)
        return a, b

    def size(self, now: float | None = None, *, backlog: bool = False) -> int:
        """The minibatch size ``m`` for the next read (module docstring); ``batch`` but for
        ``adaptive`` without a ``backlog``."""
        if self.policy != "adaptive" or backlog:
            return self.batch
        fit = self.cost()
        if fit is None:
            return self.batch
        a, b = fit
        target = self.latency_target_ms / 1000
        m_lat = (target / 2 - a) / b
        r = self.rate(now)
        m_thr = self.batch if r * b >= SATURATED else 1.2 * r * a / (1 - r * b)
        return int(min(max(m_lat, m_thr, 1), self.batch))

    def keeps_up(self, n: int, seconds: float, now: float | None = None) -> bool:
        """Whether minibatches that processed ``n`` objects in ``seconds`` keep up with the
        arrival rate ``r`` (:meth:`rate`): ``r seconds / n < SATURATED``."""
        return n <= 0 or self.rate(now) * seconds / n < SATURATED

    def regroup(self, parts: list[np.ndarray], done: int, n: int, seconds: float,
                now: float | None = None) -> list[np.ndarray]:
        """A read's minibatches with the rest after the first ``done`` in one batch if those
        ``done`` (``n`` objects in ``seconds``) did not keep up (:meth:`keeps_up`); ``parts`` as
        they are otherwise, and but for ``adaptive``.

        Parameters
        ----------
        parts
            The read's minibatches (:meth:`cut`): ``int64`` positions, each ascending.
        done
            How many of them were processed.

        Returns
        -------
        list of numpy.ndarray
            The same positions, in the same order.
        """
        if self.policy != "adaptive" or len(parts) - done < 2 or self.keeps_up(n, seconds, now):
            return parts
        self.regrouped += 1
        return parts[:done] + [np.concatenate(parts[done:])]

    def state(self, now: float | None = None) -> dict:
        """For the service's status: ``policy``, ``minibatch`` (the size a read would be
        cut to now, without a backlog), ``cost_fixed_ms`` and ``cost_per_object_ms`` of the fit
        (``None`` before any minibatch), ``arrival_per_s``, ``regrouped`` (reads whose rest went
        in one batch, :meth:`regroup`)."""
        fit = self.cost()
        return {"policy": self.policy, "minibatch": self.size(now), "regrouped": self.regrouped,
                "cost_fixed_ms": round(fit[0] * 1e3, 3) if fit else None,
                "cost_per_object_ms": round(fit[1] * 1e3, 5) if fit else None,
                "arrival_per_s": round(self.rate(now), 1)}

    def cut(self, n: int, *, backlog: bool = False, now: float | None = None) -> list[np.ndarray]:
        """The minibatches of a read of ``n`` objects: positions (``int64``), in stream order, in
        ``ceil(n / m)`` equal parts of at most the minibatch size ``m`` (:meth:`size`; ``backlog``:
        the read came back full, more is queued)."""
        if n == 0:
            return []
        return np.array_split(np.arange(n, dtype=np.int64), -(-n // self.size(now, backlog=backlog)))
