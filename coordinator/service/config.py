"""The settings of ``knnmon serve``."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any

from knnmon.coordinator.runtime.config import RunConfig
from knnmon.errors import InvalidArgumentError
from knnmon.store import StoreConfig

__all__ = ["RUN_FIELDS", "ServeConfig"]


#: The :class:`RunConfig` fields a service uses, which its status reports beside its own.
RUN_FIELDS = ("workers", "algorithm", "store", "ray_address", "executor", "batch", "processes", "limits", "window",
              "allowed_lateness", "reserve", "rebalance", "index", "redis_wait_s")


#: How long a service and its workers ride out a Redis that stopped answering, seconds
#: (``serve.redis_wait_s``; a run's default is :data:`~knnmon.connection.DEFAULT_RETRY_WINDOW_S`).
SERVE_REDIS_WAIT_S = 60.0


def _runtime() -> RunConfig:
    return RunConfig(initial=0, store=StoreConfig(durable=True), overlap_writes=False,
                     redis_wait_s=SERVE_REDIS_WAIT_S)


@dataclass(frozen=True)
class ServeConfig:
    """The ``knnmon serve`` flags: the runtime's (``run``) and the service's own.

    Attributes
    ----------
    run
        The runtime the service drives (:class:`~knnmon.coordinator.runtime.config.RunConfig`:
        workers, assignment, executor, batch (the largest object batch), store, limits, window
        and allowed lateness, reserve, re-balancing, index, release groups). Its ``initial`` is
        set to 0 (the objects seen before the stream are ``objects_dir``'s) and its
        ``overlap_writes`` to ``False`` (the service waits for a batch's writes before the next
        anyway, and overlapped writes would cost every batch a second call to each worker).
        Without a Redis URL its store is an embedded server, durable and adopted after a crash
        (the default: :class:`~knnmon.store.StoreConfig` with ``durable=True``).
    objects_dir, initial
        Preload the first ``initial`` objects (default all) of an ingest output: objects seen
        before the stream.
    max_delay_ms
        Wait at most this long after a batch's first object for more (ms).
    block_ms
        How long one read of the streams blocks (ms).
    consumer
        The service's consumer name in the group.
    checkpoint_interval_s
        With a window: seconds between checkpoints (``serve.checkpoint_interval_s``;
        :mod:`~knnmon.coordinator.recovery.checkpoint`).
    batching, latency_target_ms
        How batches form (``serve.batching``, ``serve.latency_target_ms``):
        :class:`~knnmon.coordinator.service.batching.BatchPolicy`.
    replan
        The first start recovers in full and plans every query anew (``serve.replan``), instead of
        starting the workers from the results Redis holds (:mod:`~knnmon.coordinator.recovery.resume`).
    metrics
        ``(host, port)`` of ``/metrics``, ``/healthz`` and ``/readyz``
        (:mod:`~knnmon.coordinator.service.probes`; port 0: any free one), or ``None`` (off:
        the default here; ``knnmon serve``'s is ``127.0.0.1:9464``).
    ready_max_lag
        ``/readyz`` fails while more entries than this wait in the ingest streams.

    Raises
    ------
    InvalidArgumentError
        a negative or infinite ``max_delay_ms``, a bad batching policy, ``initial < 0``,
        ``ready_max_lag < 0``, a ``metrics`` address whose host is empty or port outside 0..65535,
        ``block_ms < 1``, a checkpoint interval not finite and > 0, a missing ``objects_dir``
        (and what :class:`RunConfig` itself rejects, when it is made).
    """

    run: RunConfig = field(default_factory=_runtime)
    objects_dir: str | None = None
    initial: int | None = None
    max_delay_ms: float = 20.0
    block_ms: int = 500
    consumer: str = "serve"
    checkpoint_interval_s: float = 60.0
    batching: str = "adaptive"
    latency_target_ms: float = 50.0
    replan: bool = False
    metrics: tuple[str, int] | None = None
    ready_max_lag: int = 10_000

    def __post_init__(self) -> None:
        from knnmon.coordinator.service.batching import BatchPolicy

        if self.run.initial != 0 or self.run.overlap_writes:
            object.__setattr__(self, "run", replace(self.run, initial=0, overlap_writes=False))
        BatchPolicy(self.batching, batch=max(self.run.batch, 1), max_delay_ms=self.max_delay_ms,
                    latency_target_ms=self.latency_target_ms)  # raises when invalid (the delay too)
        if self.initial is not None and self.initial < 0:
            raise InvalidArgumentError(f"--initial must be >= 0; got {self.initial}")
        if not (math.isfinite(self.checkpoint_interval_s) and self.checkpoint_interval_s > 0):
            raise InvalidArgumentError(f"serve.checkpoint_interval_s must be a finite number > 0; "
                                       f"got {self.checkpoint_interval_s}")
        if self.ready_max_lag < 0:
            raise InvalidArgumentError(f"serve.ready_max_lag must be >= 0; got {self.ready_max_lag}")
        if self.metrics is not None:
            host, port = self.metrics
            if not isinstance(host, str) or not host or not isinstance(port, int) or not 0 <= port <= 65535:
                raise InvalidArgumentError(f"--metrics must be a host and a port in 0..65535; got {self.metrics!r}")
        if self.block_ms < 1:
            raise InvalidArgumentError(f"--block-ms must be >= 1; got {self.block_ms}")
        if self.objects_dir is not None and not os.path.isdir(self.objects_dir):
            raise InvalidArgumentError(f"--objects: no such directory: {self.objects_dir}")

    def run_config(self, redis_url: str) -> RunConfig:
        """:attr:`run`, writing to ``redis_url`` (the store the service opened)."""
        return replace(self.run, store=StoreConfig(url=redis_url, namespace=self.run.store.namespace,
                                                    data_dir=self.run.store.data_dir))

    def settings(self) -> dict[str, Any]:
        """The settings as one flat dict (:data:`RUN_FIELDS` of :attr:`run` and the service's
        own), as the status reports them."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "run"}
        return {**{k: _plain(getattr(self.run, k)) for k in RUN_FIELDS}, **{k: _plain(v) for k, v in own.items()}}


def _plain(v: Any) -> Any:
    return asdict(v) if is_dataclass(v) else v
