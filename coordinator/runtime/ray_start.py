"""Joining or starting Ray for a run (:func:`init_ray`; the worker pool and the bench use it)."""

from __future__ import annotations

import os
import signal
import threading

from knnmon.logs import adopt

__all__ = ["init_ray"]


def init_ray(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local instance
    (all cores, no dashboard, 512 MiB object store); returns ``True`` if it started Ray. The
    process's SIGTERM handler stays as it was (``ray.init`` installs one that exits with
    status 15, skipping the caller's shutdown)."""
    import ray

    adopt("ray")  # (Ray set up its own logger when imported: in JSON, its records are lines like ours)
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                 object_store_memory=512 * 1024 * 1024, log_to_driver=False)
    if main and handler is not None:
        signal.signal(signal.SIGTERM, handler)
    return True
