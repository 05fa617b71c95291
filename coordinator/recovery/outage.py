"""Riding out a Redis outage (a restart, a network cut) without rebuilding the service.

While Redis does not answer, every write of the workers and every acknowledgement waits and
retries (for ``serve.redis_wait_s`` seconds: :func:`~knnmon.connection.set_retry_window`); a read of
the ingest streams fails at once. The service then waits for Redis
(:func:`connect_when_up`) and,
if it was between two applications (nothing half applied: its state is what it acknowledged),
asks :func:`kept_every_write`: the same Redis process answers (it lost nothing), or a
restarted one kept every write this service and its workers made -- each worker's last write's
marker is there and no write failed, the consumer groups delivered at least what this service
read, and nothing it read and acknowledged is pending again. Then it reads the entries that
were delivered but not answered (a read whose reply was lost) and goes on, exactly once, with
no rebuild. Otherwise (a Redis that came back without some writes, e.g. ``appendfsync
everysec`` after a crash, or a failure in the middle of a batch) it rebuilds from Redis, as
after a restart of the service (:mod:`~knnmon.coordinator.recovery.rebuild`). A restart the
retries hid (no read failed) is found between steps by the server's ``run_id``
(:meth:`~knnmon.coordinator.recovery.watch.Watch.server`) and checked the same way. Which
failures are the infrastructure's (ridden out or rebuilt from Redis) rather than an entry's
(isolated): :func:`is_infrastructure`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import redis
from redis.cluster import RedisCluster

from knnmon.connection import connect, redact
from knnmon.errors import StoreUnavailableError, WorkerLostError
from knnmon.keys import Keys
from knnmon.protocol import GROUP, entry_order, group_info

__all__ = ["caused_by", "connect_when_up", "is_infrastructure", "kept_every_write", "server_ids"]

log = logging.getLogger("knnmon.serve")


def server_ids(client: redis.Redis) -> frozenset[str] | None:
    """The ``run_id`` of the Redis server (of every master in a cluster): a restart changes it.
    ``None`` if it cannot be read."""
    try:
        info = client.info("server")
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return None
    if "run_id" in info:
        return frozenset([info["run_id"]])
    ids = [v.get("run_id") for v in info.values() if isinstance(v, dict)]
    return frozenset(ids) if ids and all(ids) else None


def _markers(client: redis.Redis, keys: Keys, worker: int) -> set[str | None]:
    """Worker ``worker``'s idempotency marker on every master (one value on a standalone Redis)."""
    if not isinstance(client, RedisCluster):
        return {client.get(keys.worker_batch(worker))}
    from knnmon.redis_cluster import MasterMap

    masters = MasterMap(client)
    return {client.get(keys.worker_batch(worker, masters.tag_of(n))) for n in masters.names}


def kept_every_write(client: redis.Redis, keys: Keys, before: frozenset[str] | None, last_read: Mapping[str, str],
                     last_writes: Callable[[], Sequence[tuple[str | None, bool]]]) -> str | None:
    """Whether Redis holds every write of this service and its workers (module docstring):
    ``None`` if it does, else why not.

    Parameters
    ----------
    before
        :func:`server_ids` before the outage.
    last_read
        Each ingest stream -> the newest entry id this service read from it.
    last_writes
        Each worker's last write's marker value and whether a write failed since
        (:meth:`Runtime.last_writes`), asked only if the server restarted.
    """
    now = server_ids(client)
    if before is not None and now == before:
        return None
    for stream, last in last_read.items():
        group = group_info(client, stream)
        if group is None:
            return f"the consumer group {GROUP!r} of {stream} is gone"
        if entry_order(group["last-delivered-id"]) < entry_order(last):
            return f"{stream} was delivered up to {group['last-delivered-id']}, but this service read {last}"
        if group["pending"]:
            first = client.xpending(stream, GROUP)["min"]
            if first and entry_order(first) <= entry_order(last):
                return f"entry {first} of {stream} is pending again (its acknowledgement was lost)"
    for worker, (marker, failed) in enumerate(last_writes()):
        if failed:
            return f"a write of worker {worker} failed"
        if marker is not None and _markers(client, keys, worker) != {marker}:
            return f"worker {worker}'s last write is missing"
    return None


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
