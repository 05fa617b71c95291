"""Joining or starting Ray for a run (:func:`init_ray`; the worker pool and the bench use it)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

from knnmon.logs import adopt

__all__ = ["init_ray", "shutdown_ray"]


def init_ray(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local instance
    (all cores, no dashboard, 512 MiB object store); returns ``True`` if it called ``ray.init``.
    The process's SIGTERM handler stays as it was (:func:`_keeping_sigterm`)."""
    import ray

    adopt("ray")  # (Ray set up its own logger when imported: in JSON, its records are lines like ours)
    # Ray's notices that say nothing to a knnmon user: "Started a local Ray instance" (INFO:
    # ``logging_level`` below), and that token authentication is on by default (a warning;
    # docs/operations.md lists the token's file).
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    with _keeping_sigterm():
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     object_store_memory=512 * 1024 * 1024, log_to_driver=False, logging_level=logging.WARNING)
    return True


def shutdown_ray() -> None:
    """``ray.shutdown()``, the process's SIGTERM handler kept (:func:`_keeping_sigterm`)."""
    import ray

    with _keeping_sigterm():
        ray.shutdown()


@contextlib.contextmanager
def _keeping_sigterm() -> Iterator[None]:
    """The process's SIGTERM handler as it was before, once the block is done. ``ray.init``
    installs one that exits with status 15, skipping the caller's shutdown; Ray's core worker,
    shut down, leaves SIGTERM at its default action below Python (ray 2.60: a SIGTERM after
    ``ray.shutdown()`` killed the process, status -15, though Python still named the handler)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
