"""Connecting to Redis: the URL to use, deliberate timeouts, and retries with backoff."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from knnmon.errors import StoreUnavailableError

__all__ = ["DEFAULT_RETRY_WINDOW_S", "ENV_REDIS_URL", "connect", "redact", "redis_url_from_env", "replace_hash",
           "set_retry_window", "with_retries"]

ENV_REDIS_URL = "KNNMON_REDIS_URL"
log = logging.getLogger("knnmon.redis")
T = TypeVar("T")


def redact(url: str | None) -> str | None:
    """``url`` with its password (and any ``password=`` query argument) shown as ``***``: the
    only form in which knnmon prints, logs or stores a Redis URL.

    >>> redact("rediss://app:s3cret@db.example:6380/0?ssl_ca_certs=/ca.pem&password=x")
    'rediss://app:***@db.example:6380/0?ssl_ca_certs=/ca.pem&password=***'
    >>> redact("redis://127.0.0.1:6379/0")
    'redis://127.0.0.1:6379/0'
    """
    if not url:
        return url
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            auth, host = netloc.rsplit("@", 1)
            user, sep, _ = auth.partition(":")
            netloc = f"{user}:***@{host}" if sep else (f"{user}@{host}" if parts.password is None else f"***@{host}")
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query)], safe="/*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "(a Redis URL that does not parse)"


def redis_url_from_env(url: str | None) -> str | None:
    """``url`` if given, else ``$KNNMON_REDIS_URL``, else ``None`` (use the embedded server)."""
    return url or os.environ.get(ENV_REDIS_URL) or None


def connect(url: str, *, socket_timeout_s: float = 30.0) -> redis.Redis:
    """A client with string replies, deliberate timeouts and **no automatic retry**; a
    :class:`redis.cluster.RedisCluster` when ``url`` points at a node of a Redis Cluster
    (``INFO cluster``: :mod:`knnmon.redis_cluster`), which routes each command to the master of
    its key's slot (and follows ``MOVED`` on its own).

    redis-py would otherwise re-send a timed-out pipeline on its own; knnmon retries itself
    (:func:`with_retries`) after checking whether the first attempt took effect.

    Replies that are not UTF-8 decode with ``surrogateescape`` (a lone surrogate per bad byte).

    A server that does not answer gets a plain client (as lazy as redis-py's: the first command
    raises ``redis.ConnectionError``).
    """
    # Bytes that are not UTF-8 (anyone may XADD them) decode to lone surrogates instead of
    # failing the whole reply; they encode back to the same bytes, and entries holding them are
    # rejected (``knnmon.limits.check_fields``).
    options = dict(decode_responses=True, encoding_errors="surrogateescape", socket_timeout=socket_timeout_s,
                   socket_connect_timeout=5.0)
    client = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), health_check_interval=30, **options)
    from knnmon.redis_cluster import is_cluster

    try:
        if not is_cluster(client):
            return client
    except (redis.ConnectionError, redis.TimeoutError):
        return client
    client.close()
    from redis.cluster import RedisCluster

    return RedisCluster.from_url(url, **options)


#: How long :func:`with_retries` keeps trying by default, seconds (a run's ``serve.redis_wait_s``;
#: a service sets its own, :func:`set_retry_window`).
DEFAULT_RETRY_WINDOW_S = 6.2
_retry_window_s = DEFAULT_RETRY_WINDOW_S


def set_retry_window(seconds: float) -> None:
    """Make :func:`with_retries` (without ``attempts``) keep trying for ``seconds`` in this
    process: ``knnmon serve`` and its workers ride out a Redis restart this long (``serve.redis_wait_s``).

    Raises
    ------
    InvalidArgumentError
        ``seconds`` not a finite number >= 0.
    """
    import math

    from knnmon.errors import InvalidArgumentError

    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"the Redis retry window must be a finite number of seconds >= 0; got {seconds!r}")
    global _retry_window_s
    _retry_window_s = float(seconds)


def with_retries(op: Callable[[], T], what: str, url: str, *, attempts: int | None = None, backoff_s: float = 0.2,
                 before_retry: Callable[[], bool] | None = None) -> T:
    """Run ``op``; on a connection error or timeout wait (exponential backoff) and try again.

    Parameters
    ----------
    attempts
        Give up after this many attempts (delays ``backoff_s * 2**i``); default: keep trying
        for the process's retry window (:func:`set_retry_window`; 6.2 s unless set), the delay
        doubling from ``backoff_s`` up to 1 s.
    before_retry
        Called before each retry; returning ``True`` means the failed attempt did take effect
        (e.g. its idempotency marker is in Redis), so ``op`` is not run again.

    Raises
    ------
    StoreUnavailableError
        After the last attempt fails, naming ``what`` and ``url``.
    """
    deadline = time.monotonic() + _retry_window_s if attempts is None else None
    attempt = 0
    while True:
        try:
            if attempt and before_retry is not None and before_retry():
                return None  # type: ignore[return-value]
            return op()
        except (redis.ConnectionError, redis.TimeoutError) as ex:
            attempt += 1
            delay = backoff_s * 2 ** (attempt - 1) if attempts is not None else min(backoff_s * 2 ** (attempt - 1), 1.0)
            if attempts is not None and attempt >= attempts or deadline is not None and \
                    time.monotonic() + delay > deadline + 1e-9:
                raise StoreUnavailableError(f"Redis at {redact(url)} unreachable while {what} "
                                            f"(gave up after {attempt} attempts): {ex}") from ex
            log.warning("Redis at %s: %s while %s; retrying in %.1f s", redact(url), ex, what, delay)
            time.sleep(delay)


def replace_hash(client: redis.Redis, key: str, fields: dict[str, str], what: str, url: str | None) -> None:
    """Replace hash ``key`` by ``fields`` in one MULTI (retried as :func:`with_retries` when
    ``url`` is given: ``what`` names it in the log).

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    def write() -> None:
        pipe = client.pipeline(transaction=True)
        pipe.delete(key)
        if fields:
            pipe.hset(key, mapping=fields)
        pipe.execute()

    with_retries(write, what, url) if url is not None else write()
