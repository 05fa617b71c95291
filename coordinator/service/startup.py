"""What ``knnmon serve`` checks and loads before it recovers: no second service in the
namespace, the preloaded objects and the load model, a Redis that answers; and which failures
are the infrastructure's (recovered from Redis) rather than an entry's (isolated)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import pyarrow as pa
import redis

from knnmon.connection import connect, redact
from knnmon.coordinator.runtime.preparation import check_objects_in_bounds
from knnmon.coordinator.service import status as service_status
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.object_log import OBJECT_SCHEMA
from knnmon.errors import KnnmonError, StoreUnavailableError, WorkerLostError
from knnmon.keys import Keys

__all__ = ["caused_by", "connect_when_up", "is_infrastructure", "load_preload", "ray_running",
           "refuse_a_second_service"]

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


def connect_when_up(url: str, stopping: Callable[[], bool]) -> redis.Redis:
    """A client once Redis answers; waits with exponential backoff capped at 1 s (a restarted
    Redis is used within a second of answering), logging each miss.

    Raises
    ------
    StoreUnavailableError
        Redis unreachable once ``stopping()``.
    """
    delay = 0.2
    while True:
        try:
            client = connect(url)
            client.ping()
            return client
        except (redis.ConnectionError, redis.TimeoutError) as ex:
            if stopping():
                raise StoreUnavailableError(f"Redis at {redact(url)} unreachable while stopping") from ex
            log.warning("Redis at %s unreachable (%s); retrying in %.1f s", redact(url), ex, delay)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def ray_running() -> bool:
    """Whether this process is connected to Ray."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def caused_by(ex: BaseException | None, kinds: type | tuple[type, ...]) -> bool:
    """Whether ``ex`` or what it wraps (a Ray task error's ``cause``, ``__cause__``,
    ``__context__``) is one of ``kinds``."""
    seen = 0
    while ex is not None and seen < 10:
        if isinstance(ex, kinds):
            return True
        cause = getattr(ex, "cause", None)
        ex = cause if isinstance(cause, BaseException) else (ex.__cause__ or ex.__context__)
        seen += 1
    return False


def is_infrastructure(ex: BaseException) -> bool:
    """Redis unreachable or a worker lost: recovered from Redis, never blamed on an entry."""
    return caused_by(ex, (StoreUnavailableError, redis.ConnectionError, redis.TimeoutError, WorkerLostError))
