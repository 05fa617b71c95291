"""What ``knnmon serve`` checks and loads before it recovers: no second service in the
namespace, the preloaded objects and the load model. (A Redis that answers, and which failures
are the infrastructure's: :mod:`~knnmon.coordinator.recovery.outage`.)"""

from __future__ import annotations

import logging
import sys

import pyarrow as pa
import redis

from knnmon.connection import connect
from knnmon.coordinator.runtime.preparation import check_objects_in_bounds
from knnmon.coordinator.service import status as service_status
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.recovery.object_log import OBJECT_SCHEMA
from knnmon.errors import KnnmonError
from knnmon.keys import Keys

__all__ = ["load_preload", "ray_running", "refuse_a_second_service"]

log = logging.getLogger("knnmon.serve")


def refuse_a_second_service(config: ServeConfig, keys: Keys) -> None:
    """Raise if another service runs in this namespace of this Redis (its status is fresh and,
    on this host, its process lives); touches nothing.

    Raises
    ------
    KnnmonError
        Another service runs there.
    """
    url = config.run.store.live_url()
    if url is None:
        return  # no server yet: no service either
    client = connect(url)
    try:
        other = service_status.running_service(client, keys)
    except (redis.ConnectionError, redis.TimeoutError):
        other = None  # Redis away: start() waits for it and recovers
    finally:
        client.close()
    if other is not None:
        raise KnnmonError(f"a knnmon serve (pid {other.get('pid')} on {other.get('host')}) is running in namespace "
                          f"{config.run.store.namespace!r} of this Redis; stop it first, or use another --namespace")


def load_preload(config: ServeConfig):
    """The load model and the objects seen before the stream (``--objects``, the first
    ``--initial``; none without ``--objects``: a uniform load model).

    Returns
    -------
    (LoadModel, pyarrow.Table)
        The table in stream order, ``OBJECT_SCHEMA``.

    Raises
    ------
    KnnmonError
        A preloaded object is outside the entry bounds (:func:`check_objects_in_bounds`).
    """
    from knnmon.assignment import LoadModel
    from knnmon.ingest.reading import OBJECT_COLUMNS, read_objects, stream_order

    if not config.objects_dir:
        return LoadModel.uniform(), OBJECT_SCHEMA.empty_table()
    model = LoadModel.from_ingest(config.objects_dir)
    table = stream_order(read_objects(config.objects_dir, OBJECT_COLUMNS), None).cast(OBJECT_SCHEMA)
    n = table.num_rows if config.initial is None else min(config.initial, table.num_rows)
    preload: pa.Table = table.slice(0, n)
    check_objects_in_bounds(preload, config.run.limits, "the preloaded objects (--objects)")
    return model, preload


def ray_running() -> bool:
    """Whether this process is connected to Ray."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()
