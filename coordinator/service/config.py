"""The settings of ``knnmon serve``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from knnmon.coordinator.rebalance.config import RebalanceConfig
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.errors import InvalidArgumentError
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.store import StoreConfig

__all__ = ["ServeConfig"]


@dataclass(frozen=True)
class ServeConfig:
    """The ``knnmon serve`` flags.

    Attributes
    ----------
    workers, algorithm, executor, ray_address, batch, processes
        As :class:`~knnmon.coordinator.runtime.config.RunConfig`.
    objects_dir, initial
        Preload the first ``initial`` objects (default all) of an ingest output: objects seen
        before the stream.
    store
        Where results go; without a URL, an embedded server that is durable and adopted after
        a crash (:class:`~knnmon.store.StoreConfig` with ``durable=True``).
    max_delay_ms
        Wait at most this long after a batch's first object for more (ms).
    block_ms
        How long one read of the streams blocks (ms).
    consumer
        The service's consumer name in the group.
    limits
        Bounds on the entries' ``k`` and keywords (``--max-k``, ``--max-keywords``).
    window
        The sliding window, ms (``--window``; :mod:`knnmon.window`): expired objects leave
        results, late ones are rejected (``late``), and the objects stream is trimmed below what
        the window still needs. ``None``: append-only.
    allowed_lateness
        With a window: the watermark trails the largest ``t`` by this much, ms
        (``--allowed-lateness``; :class:`~knnmon.window.Window`).
    checkpoint_interval_s
        With a window: seconds between checkpoints (``--checkpoint-interval``;
        :mod:`~knnmon.coordinator.service.checkpoint`).
    reserve, rebalance, index
        As :class:`~knnmon.coordinator.runtime.config.RunConfig` (``--reserve``, ``--rebalance``,
        ``--index``).
    batching, latency_target_ms, sjf
        How batches form (``--batching``, ``--latency-target-ms``, ``--sjf``):
        :class:`~knnmon.coordinator.service.batching.BatchPolicy`.
    release_groups
        Each worker releases a minibatch's changes in up to this many Short-Job-First parts
        (``--release-groups``; :class:`~knnmon.coordinator.runtime.config.RunConfig`).

    Raises
    ------
    InvalidArgumentError
        a negative or infinite ``max_delay_ms``, a bad batching policy, ``initial < 0``, ``block_ms < 1``, a missing ``objects_dir``, or
        what :class:`RunConfig` rejects (workers outside 1..64, ``batch < 1``, an unknown
        executor).
    """

    workers: int = 2
    algorithm: str = "proposed"
    objects_dir: str | None = None
    initial: int | None = None
    store: StoreConfig = field(default_factory=lambda: StoreConfig(durable=True))
    ray_address: str | None = None
    executor: str = "ray"
    batch: int = 1000
    max_delay_ms: float = 20.0
    block_ms: int = 500
    consumer: str = "serve"
    processes: int = 2
    limits: Limits = DEFAULT_LIMITS
    window: int | None = None
    allowed_lateness: int = 0
    checkpoint_interval_s: float = 60.0
    reserve: int | None = None
    rebalance: RebalanceConfig | None = None
    index: str = "grid"
    batching: str = "adaptive"
    latency_target_ms: float = 50.0
    sjf: bool = False
    release_groups: int = 1

    def __post_init__(self) -> None:
        from knnmon.coordinator.service.batching import BatchPolicy

        BatchPolicy(self.batching, batch=max(self.batch, 1), max_delay_ms=self.max_delay_ms,
                    latency_target_ms=self.latency_target_ms, sjf=self.sjf)  # raises when invalid (the delay too)
        if self.initial is not None and self.initial < 0:
            raise InvalidArgumentError(f"--initial must be >= 0; got {self.initial}")
        if not (math.isfinite(self.checkpoint_interval_s) and self.checkpoint_interval_s > 0):
            raise InvalidArgumentError(f"--checkpoint-interval must be a finite number > 0; got {self.checkpoint_interval_s}")
        if self.block_ms < 1:
            raise InvalidArgumentError(f"--block-ms must be >= 1; got {self.block_ms}")
        if self.objects_dir is not None and not os.path.isdir(self.objects_dir):
            raise InvalidArgumentError(f"--objects: no such directory: {self.objects_dir}")
        self.run_config("redis://unused")  # validates workers, batch, executor

    def run_config(self, redis_url: str) -> RunConfig:
        """The :class:`RunConfig` of the runtime the service drives, writing to ``redis_url``
        (the store the service opened). Its workers write each batch before they return: the
        service waits for a batch's writes before the next anyway, and overlapped writes would
        cost every batch a second call to each worker."""
        store = StoreConfig(url=redis_url, namespace=self.store.namespace, data_dir=self.store.data_dir)
        return RunConfig(workers=self.workers, algorithm=self.algorithm, initial=0, batch=self.batch, store=store,
                         ray_address=self.ray_address, executor=self.executor, processes=self.processes,
                         limits=self.limits, window=self.window, allowed_lateness=self.allowed_lateness,
                         reserve=self.reserve,
                         rebalance=self.rebalance, index=self.index, overlap_writes=False,
                         release_groups=self.release_groups)
