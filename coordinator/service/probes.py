"""``knnmon serve``'s HTTP endpoint for monitoring (``--metrics HOST:PORT``; Starlette served by
uvicorn in a thread of the service's process):

- ``/metrics``: Prometheus's text format (:mod:`knnmon.coordinator.runtime.prometheus`);
- ``/healthz``: 200 while the process serves HTTP at all (a liveness probe);
- ``/readyz``: 200 when Redis answers, every worker is alive, the state is recovered and the
  ingest streams' waiting entries are within the bound, else 503; the body (JSON) names each
  check's outcome (:meth:`~knnmon.coordinator.service.telemetry.ServiceTelemetry.readiness`).

It binds before the service starts its work, so that a taken port fails the start at once.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from knnmon.errors import InvalidArgumentError

__all__ = ["DEFAULT_ADDRESS", "ProbeServer", "parse_address"]

log = logging.getLogger("knnmon.serve")

#: ``--metrics``'s default (9464: the port of OpenTelemetry's Prometheus exporter, clear of
#: Redis's and Ray's).
DEFAULT_ADDRESS = "127.0.0.1:9464"


def parse_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; ``off`` as ``None``. Port 0
    takes any free port.

    Raises
    ------
    InvalidArgumentError
        Not ``off`` and not ``HOST:PORT`` with a port in 0..65535.
    """
    if text.strip().lower() == "off":
        return None
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgumentError(f"--metrics must be HOST:PORT (port 0..65535) or off; got {text!r}")
    return host, int(port)


class ProbeServer:
    """The endpoint (module docstring) on ``address``, serving ``registry`` and ``readiness``.

    Parameters
    ----------
    address : (str, int)
        Host and port to bind (port 0: any free one; :attr:`port` is the one bound).
    registry : prometheus_client.CollectorRegistry
        What ``/metrics`` exports.
    readiness : callable returning (bool, dict of str to str)
        ``/readyz``'s answer: ready or not, and each check's outcome.

    Raises
    ------
    InvalidArgumentError
        The address cannot be bound (in use, or not an address of this host).
    """

    def __init__(self, address: tuple[str, int], registry, readiness: Callable[[], tuple[bool, dict[str, str]]]
                 ) -> None:
        import uvicorn
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse, Response
        from starlette.routing import Route

        def healthz(_request) -> PlainTextResponse:
            return PlainTextResponse("ok\n")

        def metrics(_request) -> Response:  # (a Route, not a Mount: /metrics answers, no redirect to /metrics/)
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        def readyz(_request) -> JSONResponse:  # (a plain function: Starlette runs it in a thread pool)
            ok, checks = readiness()
            return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

        app = Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)])
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as ex:
            self._sock.close()
            raise InvalidArgumentError(f"--metrics {host}:{port} cannot be bound ({ex.strerror}); pick another "
                                       "HOST:PORT, or --metrics off") from None
        self.host, self.port = host, self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="knnmon-probes", daemon=True)

    @property
    def address(self) -> str:
        """``HOST:PORT`` as bound."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> ProbeServer:
        """Serve in a daemon thread."""
        self._thread.start()
        log.info("metrics on http://%s/metrics, probes /healthz and /readyz", self.address)
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()
