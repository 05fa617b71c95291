"""What the dashboard reads from Redis, read-only and bounded: the queries (cached, thinned by
bounding box), one query's result with its objects' details, the service's status with per-worker
figures, and the recent batch records.

Nothing here writes to Redis or joins a consumer group: the dashboard runs beside ``knnmon serve``
(or after ``knnmon run``, or against a cluster) without changing what it does. Every read is
bounded: the queries are read in chunks of :data:`CHUNK` and at most :data:`MAX_QUERIES` of them,
a result has at most the service's ``limits.max_k`` members, batch records are read :data:`RECORDS` at
a time.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


from knnmon.connection import redact
from knnmon.coordinator.service import latency
from knnmon.coordinator.service.status import read_status
from knnmon.errors import KnnmonError
from knnmon.keys import Keys
from knnmon.results import ResultReader

__all__ = ["BadRequest", "CHUNK", "MAX_LIMIT", "MAX_QUERIES", "QueryCache", "RECORDS", "parse_bbox", "read_result",
           "status_view"]

#: Queries read per round trip (SSCAN count, pipelined HMGETs).
CHUNK = 2000
#: At most this many queries are cached (beyond: the first ones SSCAN returns, and the page says so).
MAX_QUERIES = 5_000_000
#: At most this many queries per ``/api/queries`` answer.
MAX_LIMIT = 10_000
#: Batch records read for throughput and latency.
RECORDS = 200
#: Heat cells per side of the bounding box (``/api/queries``' ``cells``).
HEAT_CELLS = 48


class BadRequest(KnnmonError):
    """A request the dashboard refuses (HTTP 400 with this message)."""


def parse_bbox(text: str | None) -> tuple[float, float, float, float]:
    """``"west,south,east,north"`` in degrees (longitudes may wrap: west > east is refused;
    a box beyond +-180 / +-90 is clipped).

    Raises
    ------
    BadRequest
        Not four finite numbers, or south > north, or west > east.
    """
    if not text:
        return -180.0, -90.0, 180.0, 90.0
    parts = text.split(",")
    if len(parts) != 4 or len(text) > 200:
        raise BadRequest("bbox must be west,south,east,north in degrees")
    try:
        w, s, e, n = (float(p) for p in parts)
    except ValueError:
        raise BadRequest("bbox must be four numbers: west,south,east,north") from None
    if not all(math.isfinite(v) for v in (w, s, e, n)):
        raise BadRequest("bbox must be finite numbers")
    if s > n or w > e:
        raise BadRequest("bbox must have south <= north and west <= east")
    return max(w, -180.0), max(s, -90.0), min(e, 180.0), min(n, 90.0)


@dataclass
class _Snapshot:
    ids: list[str]
    lon: np.ndarray
    lat: np.ndarray
    k: np.ndarray
    worker: np.ndarray  # int64, -1 unknown
    keywords: list[str]
    order: np.ndarray  # a fixed pseudo-random rank per query: thinning keeps the same ones while panning
    read_at: float
    truncated: bool


class QueryCache:
    """The registered queries (id, point, ``k``, worker, keywords) as columns, read from Redis in
    chunks and refreshed when older than ``max_age_s`` (one reader at a time; a request meanwhile
    gets the previous snapshot).

    Parameters
    ----------
    client
        A redis-py client (``decode_responses=True``), standalone or cluster.
    keys
        The namespace's :class:`~knnmon.keys.Keys`.
    max_age_s
        Seconds a snapshot is served before it is read again.
    """

    def __init__(self, client: Any, keys: Keys, max_age_s: float = 30.0) -> None:
        self.client, self.keys, self.max_age_s = client, keys, max_age_s
        self._snap: _Snapshot | None = None
        self._lock = threading.Lock()

    def _read(self) -> _Snapshot:
        ids: list[str] = []
        lon, lat, k, worker, words = [], [], [], [], []
        truncated = False
        for_chunk: list[str] = []

        def flush() -> None:
            pipe = self.client.pipeline(transaction=False)
            for qid in for_chunk:
                pipe.hmget(self.keys.query(qid), "lon", "lat", "k", "worker", "keywords")
            for qid, (x, y, kk, w, kw) in zip(for_chunk, pipe.execute()):
                try:
                    x, y, kk = float(x), float(y), int(kk)
                except (TypeError, ValueError):
                    continue  # being written, or deleted meanwhile
                ids.append(qid)
                lon.append(x)
                lat.append(y)
                k.append(kk)
                worker.append(int(w) if w is not None and str(w).lstrip("-").isdigit() else -1)
                words.append(kw or "")
            for_chunk.clear()

        for qid in self.client.sscan_iter(self.keys.queries, count=CHUNK):
            if len(ids) + len(for_chunk) >= MAX_QUERIES:
                truncated = True
                break
            for_chunk.append(qid)
            if len(for_chunk) >= CHUNK:
                flush()
        if for_chunk:
            flush()
        order = np.random.default_rng(0).permutation(len(ids))
        return _Snapshot(ids, np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64),
                         np.asarray(k, dtype=np.int64), np.asarray(worker, dtype=np.int64), words, order,
                         time.monotonic(), truncated)

    def snapshot(self) -> _Snapshot:
        """The current snapshot, read now if none or too old."""
        snap = self._snap
        if snap is not None and time.monotonic() - snap.read_at < self.max_age_s:
            return snap
        if self._lock.acquire(blocking=snap is None):
            try:
                if self._snap is snap:
                    self._snap = self._read()
            finally:
                self._lock.release()
        return self._snap  # type: ignore[return-value]

    def refresh(self) -> None:
        """Forget the snapshot: the next request reads the queries again."""
        self._snap = None

    def in_bbox(self, bbox: tuple[float, float, float, float], limit: int) -> dict[str, Any]:
        """The queries inside ``bbox`` (west, south, east, north; degrees), thinned to at most
        ``limit`` (the same pseudo-random ones whatever the box, so a pan keeps them), with
        ``total`` (in the box), ``cells``: a :data:`HEAT_CELLS`-square grid over the box of
        ``[west, south, east, north, queries, main worker]`` per non-empty cell, and ``workers``
        (queries per worker in the box).

        Raises
        ------
        BadRequest
            ``limit`` outside 1..:data:`MAX_LIMIT`.
        """
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
        s = self.snapshot()
        w, so, e, n = bbox
        inside = np.flatnonzero((s.lon >= w) & (s.lon <= e) & (s.lat >= so) & (s.lat <= n))
        keep = inside[np.argsort(s.order[inside], kind="stable")[:limit]]
        cells = []
        if len(inside):
            dx, dy = max(e - w, 1e-9) / HEAT_CELLS, max(n - so, 1e-9) / HEAT_CELLS
            cx = np.minimum(((s.lon[inside] - w) / dx).astype(np.int64), HEAT_CELLS - 1)
            cy = np.minimum(((s.lat[inside] - so) / dy).astype(np.int64), HEAT_CELLS - 1)
            cell = cx * HEAT_CELLS + cy
            wk = np.maximum(s.worker[inside], 0)
            nw = int(wk.max()) + 1
            counts = np.bincount(cell * nw + wk, minlength=HEAT_CELLS * HEAT_CELLS * nw).reshape(-1, nw)
            for c in np.flatnonzero(counts.sum(axis=1)).tolist():
                x, y = divmod(c, HEAT_CELLS)
                cells.append([w + x * dx, so + y * dy, w + (x + 1) * dx, so + (y + 1) * dy,
                              int(counts[c].sum()), int(counts[c].argmax())])
        per_worker = np.bincount(np.maximum(s.worker[inside], 0), minlength=1)
        return {"total": int(len(inside)), "returned": int(len(keep)), "registered": len(s.ids),
                "truncated": s.truncated, "read_age_s": round(time.monotonic() - s.read_at, 1),
                "queries": [{"id": s.ids[i], "lon": float(s.lon[i]), "lat": float(s.lat[i]), "k": int(s.k[i]),
                             "worker": int(s.worker[i]), "keywords": s.keywords[i]} for i in keep.tolist()],
                "cells": cells, "workers": per_worker.tolist()}

    def find(self, text: str, limit: int = 20) -> list[str]:
        """Query ids starting with ``text`` (at most ``limit``), for the search box."""
        if not text or len(text) > 200:
            return []
        return [q for q in self.snapshot().ids if q.startswith(text)][:max(1, min(limit, 100))]


def read_result(client: Any, keys: Keys, qid: str) -> dict[str, Any] | None:
    """Query ``qid`` with its current kNN from Redis (``None``: not registered): its point,
    keywords, ``k`` and worker; each neighbour's id, distance (m) and, where its worker's details
    hash has it, point, time (epoch ms) and keywords; and ``radius_m``, the kNN radius ``r_q``
    (the k-th distance; ``None`` while fewer than ``k`` objects match)."""
    if not qid or len(qid) > 512:
        return None
    stored = ResultReader(client, keys).read(qid)
    if stored is None or stored.query.lon is None or stored.query.lat is None:
        return None
    q = stored.query
    result = []
    for n in stored.knn:
        row: dict[str, Any] = {"id": n.id, "distance_m": n.distance_m}
        if n.lon is not None:
            row.update(lon=n.lon, lat=n.lat, t=n.t, keywords=n.keywords)
        result.append(row)
    return {"query": {"id": qid, "lon": q.lon, "lat": q.lat, "k": q.k or 0, "keywords": q.keywords,
                      "worker": q.fields.get("worker")},
            "result": result, "radius_m": stored.radius_m}


def status_view(url: str, client: Any, keys: Keys) -> dict[str, Any]:
    """:func:`~knnmon.coordinator.service.status.read_status` (the Redis URL redacted) with what
    the page shows per worker: queries, predicted load and measured busy time (each as a share
    of the total; ``None`` while all are 0, e.g. no plan has predicted the loads of queries that
    all arrived by registration), and from the last :data:`RECORDS` batch records the throughput (objects/s),
    the response time's p50 / p99 (ms) and the rejects."""
    s = read_status(url, keys.namespace)
    svc = s.get("service") or {}
    if "redis" in svc:
        svc["redis"] = redact(svc["redis"])
    records = [f for _, f in client.xrevrange(keys.serve_batches, count=RECORDS)]
    hist = latency.decode(f.get("lat_hist", "") for f in records)
    objects = sum(int(f.get("objects", 0) or 0) for f in records)
    done = [float(f["done_ms"]) for f in records if f.get("done_ms")]
    span_s = (max(done) - min(done)) / 1e3 if len(done) > 1 else 0.0

    def share(xs: list[float]) -> list[float] | None:  # None: nothing predicted or measured yet
        total = float(sum(xs))
        return [round(x / total, 4) for x in xs] if total > 0 else None

    s["workers"] = {"queries": svc.get("queries_per_worker", []),
                    "predicted_load": share(svc.get("predicted_load_per_worker", [])),
                    "measured_load": share(svc.get("busy_ms_per_worker", []))}
    s["recent"] = {"batches": len(records), "objects": objects,
                   "objects_per_s": round(objects / span_s, 1) if span_s > 0 else None,
                   "latency_ms_p50": _finite(latency.percentile(hist, 50)),
                   "latency_ms_p99": _finite(latency.percentile(hist, 99)),
                   "rejects": sum(int(f.get("rejects", 0) or 0) for f in records)}
    return s


def _finite(x: float) -> float | None:
    return round(x, 2) if math.isfinite(x) else None
