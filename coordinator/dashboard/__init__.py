"""``knnmon dashboard``: a live map of the queries, their kNN and the stream, read only from Redis.

- :mod:`~knnmon.coordinator.dashboard.app` -- the web app (Starlette) and its JSON endpoints;
- :mod:`~knnmon.coordinator.dashboard.reader` -- the bounded, read-only Redis reads behind them;
- :mod:`~knnmon.coordinator.dashboard.events` -- the live feed (server-sent events);
- ``static/`` -- the page, its script and style, and the vendored map library and outlines
  (``static/vendor/README.md``).
"""
