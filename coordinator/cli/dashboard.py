"""``knnmon dashboard``: a live map of the queries, their kNN and the stream
(:mod:`knnmon.coordinator.dashboard`), served on loopback unless told otherwise."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
from typing import Any

from knnmon.coordinator.cli.options import add_store_options, add_verb, store_config
from knnmon.errors import InvalidArgumentError
from knnmon.store import StoreConfig

__all__ = ["DEFAULT_HTTP", "add_dashboard_command", "dashboard_on", "parse_http", "serve_dashboard"]

DEFAULT_HTTP = "127.0.0.1:8765"

log = logging.getLogger("knnmon.dashboard")


def parse_http(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) as ``(host, port)``.

    Raises
    ------
    InvalidArgumentError
        No port, or a port outside 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidArgumentError(f"--http must be HOST:PORT, e.g. {DEFAULT_HTTP}; got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgumentError(f"--http: the port must be 0..65535; got {port!r}")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_dashboard(url: str, namespace: str, http: str = DEFAULT_HTTP, *, tiles: str | None = None) -> None:
    """Serve the dashboard for Redis ``url`` on ``http`` (``HOST:PORT``; port 0: a free one) until
    interrupted; prints the address to open once it listens (never the Redis URL's password).

    Raises
    ------
    InvalidArgumentError
        A bad ``http`` or one that cannot be listened on (in use), or a ``tiles`` that is not an
        http(s) URL template.
    """
    import uvicorn

    from knnmon.coordinator.dashboard.app import create_app

    host, port = parse_http(http)
    if tiles is not None and not (tiles.startswith(("https://", "http://")) and "{z}" in tiles):
        raise InvalidArgumentError("--tiles must be an http(s) URL template with {z}, {x} and {y}")
    app = create_app(url, namespace, tiles=tiles)
    sock = _listen(host, port)  # bound before the address is printed: port 0 picks a free one
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"knnmon dashboard: http://{shown}:{port}/ (namespace {namespace!r}); Ctrl-C stops it", flush=True)
    if not _loopback(host):
        print("knnmon dashboard: warning: listening beyond loopback; the dashboard has no login, so anyone who "
              "reaches this port sees the queries and results", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``0``: any free port).

    Raises
    ------
    InvalidArgumentError
        The address cannot be bound (in use, or not this host's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as ex:
        sock.close()
        raise InvalidArgumentError(f"--http {host}:{port}: cannot listen there ({ex.strerror})") from ex
    return sock


def dashboard_on(config: StoreConfig, http: str = DEFAULT_HTTP, *, tiles: str | None = None) -> None:
    """Serve the dashboard on the results ``config`` names (a URL, or the embedded server of its
    data directory, as a service left it or as ``knnmon run`` saved it) until interrupted.

    Raises
    ------
    InvalidArgumentError
        A bad ``http``.
    KnnmonError
        No URL and nothing saved in the data directory.
    """
    from knnmon.store import open_store

    parse_http(http)  # a bad address fails before Redis is opened
    with open_store(config, existing=True) as store:
        serve_dashboard(store.url, config.namespace, http, tiles=tiles)


def _dashboard(a: argparse.Namespace) -> int:
    dashboard_on(store_config(a), a.http, tiles=a.tiles)
    return 0


def add_dashboard_command(sub: Any) -> None:
    """Register ``dashboard`` on a root parser's subparsers."""
    d = add_verb(sub, "dashboard", "a live map of the queries, their kNN and the stream, in a web browser")
    add_store_options(d)
    d.add_argument("--http", default=DEFAULT_HTTP, metavar="HOST:PORT",
                   help=f"where the page is served (default {DEFAULT_HTTP}: this machine only; port 0: a free one, "
                        "printed; from another host, use an SSH tunnel: ssh -L 8765:127.0.0.1:8765 HOST)")
    d.add_argument("--tiles", metavar="URL",
                   help="a web map tiles URL template, e.g. https://tile.openstreetmap.org/{z}/{x}/{y}.png "
                        "(default: none, the outlines shipped with knnmon; the page then loads nothing from "
                        "another host)")
    d.set_defaults(func=_dashboard)
