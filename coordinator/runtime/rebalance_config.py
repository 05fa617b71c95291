"""Re-balancing's settings (``--rebalance`` and its knobs), and the record each re-plan leaves."""

from __future__ import annotations

from dataclasses import dataclass, field

from knnmon.errors import InvalidArgumentError

__all__ = ["RebalanceConfig", "Replan", "ReplanMove", "TRIGGERS"]

#: When a re-plan is due (:mod:`knnmon.coordinator.rebalance.monitor`).
TRIGGERS = ("window", "smoothed")


@dataclass(frozen=True)
class RebalanceConfig:
    """When and how much to re-balance.

    Attributes
    ----------
    window : int
        Batches the trigger looks at (and the least between two re-plans).
    threshold : float
        Slowest / mean busy time over the window above which a re-plan is due.
    budget : float
        Share of all queries one re-plan may move (0..1).
    min_gain : float
        Moves stop once the slowest and the least busy worker are within this share of the
        slowest's busy time; a whole set moves only if it carries at least this share.
    min_total_gain : float
        A re-plan moves nothing unless its moves together lower the slowest worker's predicted
        busy time by this share.
    cooldown : int
        A query moved by one of the last ``cooldown`` re-plans does not move again (no
        ping-pong of a hot set between workers).
    trigger : str
        ``"window"`` (slowest / mean over the last ``window`` batches, at most one re-plan per
        window) or ``"smoothed"`` (over busy times smoothed with ``half_life``, above their
        noise, and only when the move's predicted gain over ``horizon`` batches exceeds its
        measured cost): :mod:`~knnmon.coordinator.rebalance.monitor`.
    half_life : float
        With ``trigger="smoothed"``: batches after which a busy time counts half.
    horizon : int
        With ``trigger="smoothed"``: batches a move's predicted gain per batch is counted over,
        against the move's cost (the largest move's migration time so far, scaled by the queries
        moved).

    Raises
    ------
    InvalidArgumentError
        A value out of range.
    """

    window: int = 20
    threshold: float = 1.2
    budget: float = 0.05
    min_gain: float = 0.05
    min_total_gain: float = 0.10
    cooldown: int = 2
    trigger: str = "smoothed"  # measured against window (and the removed predictive): docs/rebalance.md
    half_life: float = 4.0
    horizon: int = 20

    def __post_init__(self) -> None:
        if self.window < 1:
            raise InvalidArgumentError(f"the re-balancing window must be >= 1 batch; got {self.window}")
        if not self.threshold >= 1.0:  # (NaN too)
            raise InvalidArgumentError(f"the re-balancing threshold must be >= 1; got {self.threshold}")
        if not 0.0 <= self.budget <= 1.0:
            raise InvalidArgumentError(f"the re-balancing budget must be in [0, 1]; got {self.budget}")
        if not 0.0 <= self.min_total_gain < 1.0:
            raise InvalidArgumentError(f"the re-balancing min_total_gain must be in [0, 1); got {self.min_total_gain}")
        if self.trigger not in TRIGGERS:
            raise InvalidArgumentError(f"Invalid re-balancing trigger: {self.trigger!r}.\nValid options are: "
                                       f"{TRIGGERS}")
        if not 0 < self.half_life < float("inf") or self.horizon < 1:  # (NaN too)
            raise InvalidArgumentError(f"the re-balancing half-life must be finite and > 0 and the horizon >= 1 "
                                       f"batch; got {self.half_life}, {self.horizon}")
        if self.cooldown < 0:
            raise InvalidArgumentError(f"the re-balancing cooldown must be >= 0; got {self.cooldown}")
        if not 0.0 <= self.min_gain < 1.0:
            raise InvalidArgumentError(f"the re-balancing min_gain must be in [0, 1); got {self.min_gain}")


@dataclass(frozen=True)
class ReplanMove:
    """One move of a re-plan: ``queries`` queries of ``unit`` (a query set's keywords and grid
    cells, cut to 200 characters) from worker ``source`` to ``target``, predicted to cost the
    target ``predicted_ms`` per batch."""

    source: int
    target: int
    queries: int
    predicted_ms: float
    unit: str


@dataclass
class Replan:
    """What one re-plan did (:mod:`~knnmon.coordinator.rebalance.rebalancer`), kept in
    ``Rebalancer.replans`` and, as JSON (:func:`dataclasses.asdict`), in ``knn:replans``.

    Numbered ``replan`` from 1; planned at ``batch`` from the loads asked for after
    ``asked_after_batch``, when the slowest / mean busy time was ``trigger``. Per worker ``(W,)``
    ms per batch: the smoothed busy times the plan started from (``busy_ms``), as measured
    (``measured_busy_ms``), as predicted after the moves (``predicted_ms``). ``predicted_gain``:
    the slowest worker's predicted fall as a share; ``predicted_gain_ms`` and
    ``predicted_cost_ms`` over the horizon. ``queries_moved`` of at most ``budget``; seconds
    in all, asking for the loads, planning and moving, the move's phases in ms, and the routing
    entries its release narrowed (``None`` until answered). Filled in later: ``land_seconds``
    (a move that went on beside batches: the stall when it landed), ``realized_gain`` over
    ``realized_after_batches`` batches (:class:`~knnmon.coordinator.rebalance.records.ReplanRecords`).
    """

    replan: int
    batch: int
    asked_after_batch: int
    trigger: float
    busy_ms: list[float]
    measured_busy_ms: list[float]
    predicted_ms: list[float]
    predicted_gain: float
    queries_moved: int
    budget: int
    moves: list[ReplanMove] = field(default_factory=list)
    seconds: float = 0.0
    loads_seconds: float = 0.0
    plan_seconds: float = 0.0
    move_seconds: float = 0.0
    move_phases_ms: dict[str, float] = field(default_factory=dict)
    entries_narrowed: int | None = None
    predicted_gain_ms: float = 0.0
    predicted_cost_ms: float = 0.0
    land_seconds: float | None = None
    realized_gain: float | None = None
    realized_after_batches: int | None = None
