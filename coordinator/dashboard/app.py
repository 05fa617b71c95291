"""``knnmon dashboard``'s web app (Starlette): one page with a map, and the JSON endpoints it uses.

Endpoints (all ``GET``, read-only; a bad request is a 4xx with ``{"error": message}``, never a
stack trace):

- ``/`` -- the page (``static/index.html``); ``/static/...`` its script, style, and the map
  library and outlines it was installed with (no CDN);
- ``/api/config`` -- what the page needs to start: namespace, web tiles URL if configured;
- ``/api/status`` -- :func:`~knnmon.coordinator.dashboard.reader.status_view`: the service's
  status, per-worker queries and load (predicted, measured), throughput, p50 / p99, stream lag,
  rejects;
- ``/api/queries?bbox=w,s,e,n&limit=N`` -- the queries in a box, thinned to ``N`` (default
  2,000, at most :data:`~knnmon.coordinator.dashboard.reader.MAX_LIMIT`), with heat cells and
  counts per worker (:meth:`~knnmon.coordinator.dashboard.reader.QueryCache.in_bbox`);
- ``/api/search?q=prefix`` -- query ids starting with ``prefix`` (at most 20);
- ``/api/results/{qid}`` -- the query and its current kNN with distances and the kNN radius
  (404 if not registered);
- ``/api/changes[?qid=...]`` -- server-sent events: objects arriving, result changes (the watched
  query's lines), status (:mod:`~knnmon.coordinator.dashboard.events`).

The Redis URL (and its password) stays in the process: no endpoint returns it unredacted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from knnmon.connection import connect
from knnmon.coordinator.dashboard.events import LiveFeed
from knnmon.coordinator.dashboard.reader import BadRequest, QueryCache, parse_bbox, read_result, status_view
from knnmon.errors import StoreUnavailableError
from knnmon.keys import Keys

__all__ = ["STATIC", "create_app"]

log = logging.getLogger("knnmon.dashboard")

#: The page, its script and style, and the vendored map library and outlines.
STATIC = Path(__file__).parent / "static"


def _int(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None


def create_app(url: str, namespace: str, *, tiles: str | None = None, max_age_s: float = 30.0) -> Starlette:
    """The dashboard app reading Redis at ``url`` (namespace ``namespace``).

    Parameters
    ----------
    url
        A Redis URL (standalone or a cluster node); kept in the process, never served.
    namespace
        The key prefix (:class:`~knnmon.keys.Keys`).
    tiles
        A web tiles URL template (``https://.../{z}/{x}/{y}.png``) for the page's basemap;
        ``None``: the offline outlines only, and the page requests nothing from another host.
    max_age_s
        Seconds the query snapshot is served before it is read again.
    """
    keys = Keys(namespace)
    client = connect(url)
    cache = QueryCache(client, keys, max_age_s=max_age_s)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def config(request: Request) -> Response:
        return JSONResponse({"namespace": namespace, "tiles": tiles})

    def status(request: Request) -> Response:
        return JSONResponse(status_view(url, client, keys))

    def queries(request: Request) -> Response:
        bbox = parse_bbox(request.query_params.get("bbox"))
        return JSONResponse(cache.in_bbox(bbox, _int(request, "limit", 2000)))

    def search(request: Request) -> Response:
        return JSONResponse({"ids": cache.find(request.query_params.get("q", ""))})

    def result(request: Request) -> Response:
        got = read_result(client, keys, request.path_params["qid"])
        if got is None:
            raise HTTPException(404, f"no query {request.path_params['qid'][:100]!r} is registered")
        return JSONResponse(got)

    def changes(request: Request) -> Response:
        qid = request.query_params.get("qid") or None
        if qid is not None and len(qid) > 512:
            raise BadRequest("qid is too long")
        feed = LiveFeed(connect(url), url, keys, qid)
        return StreamingResponse(feed.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def bad_request(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    async def store_down(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "Redis is unreachable; retrying"}, status_code=503)

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("dashboard: %s on %s: %s", type(exc).__name__, request.url.path, exc)
        return JSONResponse({"error": "internal error (logged by the dashboard)"}, status_code=500)

    from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

    routes = [
        Route("/", page),
        Route("/api/config", config),
        Route("/api/status", status),
        Route("/api/queries", queries),
        Route("/api/search", search),
        Route("/api/results/{qid:path}", result),
        Route("/api/changes", changes),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers: dict[Any, Any] = {BadRequest: bad_request, HTTPException: http_error,
                                StoreUnavailableError: store_down, RedisConnectionError: store_down,
                                RedisTimeoutError: store_down, Exception: internal}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.cache = cache
    return app
