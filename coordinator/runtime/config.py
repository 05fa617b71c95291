"""The settings of one run of the runtime (the ``knnmon run`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from knnmon.assignment.routing import MAX_ENTRIES, check_max_entries
from knnmon.connection import DEFAULT_RETRY_WINDOW_S
from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig
from knnmon.errors import InvalidArgumentError
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.store import StoreConfig
from knnmon.window import Window
from knnmon.workers.settings import WorkerSettings

__all__ = ["ARRIVAL_EPOCH_MS", "DEFAULT_RESERVE", "EXECUTORS", "RunConfig"]

#: Where the workers run: Ray actors, or plain objects in the coordinator's process.
EXECUTORS = ("ray", "inline")

#: Neighbours kept beyond ``k`` with a window unless ``window.reserve`` says otherwise.
DEFAULT_RESERVE = 8

#: The time ``run.arrival_ms`` gives the first object: 2020-01-01T00:00:00Z, epoch ms.
ARRIVAL_EPOCH_MS = 1_577_836_800_000
#: The largest ``run.arrival_ms``: one object a day (times stay far inside int64 for any stream).
MAX_ARRIVAL_MS = 86_400_000

@dataclass(frozen=True)
class RunConfig:
    """Parameters of a run.

    Attributes
    ----------
    workers : int
        1..64.
    algorithm : str
        The assignment (:data:`knnmon.assignment.ALGORITHMS`).
    initial : int
        Objects seen before the stream starts (their kNN is computed exactly at start).
    batch, batches : int
        Objects per batch; stop after ``batches`` batches (``None``: the whole stream).
    shuffle : int or None
        Stream in random order with this seed instead of ``(t, id)``.
    store : StoreConfig
        Where results go.
    executor : str
        ``"ray"`` or ``"inline"`` (:data:`EXECUTORS`; :mod:`~knnmon.coordinator.runtime.worker_pool`).
    index : str
        The workers' query index (:data:`knnmon.workers.settings.INDEX_NAMES`).
    in_flight : int
        Batches kept dispatched but not yet collected: with 2, the coordinator routes batch
        ``b + 1`` while the workers and Redis still work on ``b``. Each worker runs its batches
        in the order sent, so results stay exact; a batch's update time then includes its wait
        behind the previous one.
    overlap_writes : bool
        Each worker writes a batch's changes on a background thread
        (:class:`~knnmon.workers.write_queue.WriteQueue`) and computes the next batch
        meanwhile; a batch still counts as done only once its write is in Redis. It helps only
        with ``in_flight >= 2``.
    beta, sets_per_worker, delivery_cost, cost_model, routing_entries, seed
        Planning parameters (:func:`~knnmon.coordinator.planning.plan_workload`).
    processes : int
        Processes for the initial kNN search.
    limits : Limits
        Bounds on the queries' ``k`` and keywords (``limits.max_k``, ``limits.max_keywords``).
    window : int or None
        The sliding window, ms (``--window``; :mod:`knnmon.window`); ``None``: append-only.
    allowed_lateness : int
        With a window: the watermark trails the largest ``t`` applied by this much, ms
        (``window.allowed_lateness``; :class:`~knnmon.window.Window`); 0: the largest ``t``.
    arrival_ms : int or None
        Replace every object's ``t`` by its arrival time: the ``i``-th object of the stream
        (initial ones first) gets ``ARRIVAL_EPOCH_MS + i * arrival_ms`` (``run.arrival_ms``): a
        shuffled stream keeps its order in event time then. ``None``: the data's own times.
    reserve : int or None
        Neighbours each query keeps beyond its ``k`` (``window.reserve``): with a window, an expiry
        then takes the next neighbour from the reserve instead of a refill search.
        ``None``: :data:`DEFAULT_RESERVE` with a window, else 0 (see :attr:`places_reserved`).
    rebalance : RebalanceConfig or None
        Re-balance under drift (``--rebalance``; :mod:`knnmon.coordinator.rebalance`); ``None``: the
        plan stays as made.
    redis_wait_s : float
        How long the coordinator and the workers retry a Redis that does not answer before they
        give up on it, seconds (``serve.redis_wait_s`` of ``serve``:
        :func:`~knnmon.connection.set_retry_window`): a Redis restart shorter than this costs
        a wait, not a recovery.

    Raises
    ------
    InvalidArgumentError
        ``workers`` outside 1..64, ``batch < 1``, ``initial < 0``, ``batches < 1``,
        ``in_flight < 1``, an unknown ``executor`` or ``index``, a bad ``routing_entries``,
        a window outside 1 ms..10 years, an allowed lateness outside 0..10 years or without a
        window, ``arrival_ms`` outside 1..:data:`MAX_ARRIVAL_MS`, a
        ``reserve`` outside 0..1000, ``redis_wait_s`` outside 0..3600.
    """

    workers: int = 2
    algorithm: str = "proposed"
    initial: int = 1_000_000
    batch: int = 1000
    batches: int | None = None
    shuffle: int | None = None
    store: StoreConfig = field(default_factory=StoreConfig)
    ray_address: str | None = None
    executor: str = "ray"
    beta: int = 100_000
    sets_per_worker: int = 8
    delivery_cost: float | None = None
    cost_model: str = "measured"
    processes: int = 2
    seed: int = 0
    index: str = "grid"
    in_flight: int = 2
    routing_entries: int = MAX_ENTRIES
    overlap_writes: bool = True
    limits: Limits = DEFAULT_LIMITS
    window: int | None = None
    allowed_lateness: int = 0
    arrival_ms: int | None = None
    reserve: int | None = None
    rebalance: RebalanceConfig | None = None
    redis_wait_s: float = DEFAULT_RETRY_WINDOW_S

    def __post_init__(self) -> None:
        if not (isinstance(self.redis_wait_s, (int, float)) and 0 <= self.redis_wait_s <= 3600):
            raise InvalidArgumentError(f"serve.redis_wait_s must be between 0 and 3600 seconds; "
                                       f"got {self.redis_wait_s}")
        if not 1 <= self.workers <= 64:
            raise InvalidArgumentError(f"--workers must be between 1 and 64; got {self.workers}")
        if self.batch < 1:
            raise InvalidArgumentError(f"batch must be >= 1; got {self.batch}")
        if self.initial < 0:
            raise InvalidArgumentError(f"--initial must be >= 0; got {self.initial}")
        if self.batches is not None and self.batches < 1:
            raise InvalidArgumentError(f"batches must be >= 1; got {self.batches}")
        check_max_entries(self.routing_entries)
        # (the workers' own settings, checked where they are defined)
        WorkerSettings(index=self.index, overlap_writes=self.overlap_writes)
        if self.executor not in EXECUTORS:
            raise InvalidArgumentError(f"Invalid executor: {self.executor!r}.\nValid options are: {EXECUTORS}")
        if self.window is not None:
            Window(self.window, lateness_ms=self.allowed_lateness)  # raises when out of range
        elif self.allowed_lateness:
            raise InvalidArgumentError("window.allowed_lateness needs --window: without a window no object is late")
        if self.reserve is not None and not 0 <= self.reserve <= 1000:
            raise InvalidArgumentError(f"window.reserve must be between 0 and 1000; got {self.reserve}")
        if self.arrival_ms is not None and not 1 <= self.arrival_ms <= MAX_ARRIVAL_MS:
            raise InvalidArgumentError(f"run.arrival_ms must be between 1 and {MAX_ARRIVAL_MS:,} (a day); "
                                       f"got {self.arrival_ms}")
        if self.in_flight < 1:
            raise InvalidArgumentError(f"run.in_flight must be >= 1; got {self.in_flight}")

    @property
    def places_reserved(self) -> int:
        """The reserve in effect: ``reserve``, else :data:`DEFAULT_RESERVE` with a window, else 0."""
        if self.reserve is not None:
            return self.reserve
        return DEFAULT_RESERVE if self.window is not None else 0
