"""Whether a restart may start every worker from the results Redis holds, instead of a full
recovery (:mod:`~knnmon.coordinator.recovery.stored_start` says how; recovery,
:mod:`~knnmon.coordinator.recovery.rebuild`, searches and compares every result).

The stored results are exact for the settings they were computed under, so each start records
them in ``knn:serve:settings`` (:func:`record_settings`: the workers, the window, the allowed
lateness, the reserve, the entry limits, the preloaded objects, and the assignment's algorithm and
parameters: a start with another one plans anew), and a full recovery deletes
them first (:func:`forget_settings`): a recovery cut short leaves none, and the next start
recovers in full again. A start may resume from the stored results (:func:`why_not_resumable`)
when

- the settings are the recorded ones;
- no entries are being isolated (poison isolation rebuilds without them: the stored results
  may hold some of their effects);
- Redis is one server (a Redis Cluster recovers in full);
- every registered query's hash names its worker, within the workers, and no re-balancing move
  is noted in it (:func:`stored_start`).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import redis

from knnmon.connection import replace_hash, with_retries
from knnmon.coordinator.recovery.stored_start import StoredStart
from knnmon.keys import Keys
from knnmon.query import Query, QueryColumns
from knnmon.workers.placements import placement_number

__all__ = ["forget_settings", "record_settings", "settings_of", "stored_start", "why_not_resumable"]


def settings_of(config, preload_rows: int) -> dict[str, str]:
    """What the stored results depend on, of a
    :class:`~knnmon.coordinator.service.config.ServeConfig`, as ``knn:serve:settings`` holds it."""
    run = config.run
    plan = {k: getattr(run, k) for k in ("algorithm", "beta", "sets_per_worker", "cost_model", "delivery_cost",
                                         "seed", "routing_entries")}
    return {"workers": str(run.workers), "window": str(run.window), "allowed_lateness": str(run.allowed_lateness),
            "reserve": str(run.places_reserved), "limits": json.dumps(asdict(run.limits), sort_keys=True),
            "preload": f"{config.objects_dir}:{config.initial}:{preload_rows}",
            "plan": json.dumps(plan, sort_keys=True)}


def forget_settings(client: redis.Redis, keys: Keys, url: str | None = None) -> None:
    """Delete ``knn:serve:settings`` (a full recovery is about to rewrite the results)."""
    with_retries(lambda: client.delete(keys.serve_settings), "forgetting the settings", url)


def record_settings(client: redis.Redis, keys: Keys, settings: dict[str, str], url: str | None = None) -> None:
    """Write ``knn:serve:settings``: Redis holds exact results for these settings."""
    replace_hash(client, keys.serve_settings, settings, "recording the settings", url)


def why_not_resumable(client: redis.Redis, keys: Keys, settings: dict[str, str], skip: frozenset[str]) -> str | None:
    """Why this start must recover in full (module docstring); ``None``: it may resume, if the
    placements allow (:func:`stored_start`)."""
    from redis.cluster import RedisCluster

    if skip:
        return "entries are being isolated"
    if isinstance(client, RedisCluster):
        return "a Redis Cluster"
    recorded = client.hgetall(keys.serve_settings)
    if recorded != settings:
        changed = sorted(k for k in settings.keys() | recorded.keys() if recorded.get(k) != settings.get(k))
        return "no settings recorded" if not recorded else f"the settings changed ({', '.join(changed)})"
    return None


def stored_start(queries: list[Query], placed: dict[str, tuple], workers: int, log, number: int
                 ) -> tuple[StoredStart | None, str | None]:
    """The :class:`StoredStart` of ``queries`` (as read, with their hashes' placements
    ``placed``: :func:`~knnmon.workers.placements.placement_of`), with ``log`` (the objects
    stream's :class:`~knnmon.coordinator.recovery.rebuild.ObjectLog`, or its future), the replay
    at batch ``number``; or ``None`` and why not (a query without a valid worker, or with a move
    noted)."""
    worker = np.empty(len(queries), dtype=np.int32)
    set_of = np.full(len(queries), -1, dtype=np.int32)
    for i, q in enumerate(queries):
        w, _, s, moved = placed.get(q.id, (None, None, None, False))
        if moved:
            return None, f"query {q.id[:64]} has a re-balancing move noted"
        on, in_set = placement_number(w), placement_number(s)
        if on is None or on >= workers:
            return None, f"query {q.id[:64]} has no worker among the {workers}: {str(w)[:32]!r}"
        worker[i], set_of[i] = on, in_set if in_set is not None and in_set < 2 ** 31 else -1
    q = QueryColumns.of(queries)
    columns = QueryColumns(q.ids, np.asarray(q.lon, dtype=np.float64), np.asarray(q.lat, dtype=np.float64), q.keywords,
                           np.asarray(q.k, dtype=np.int64))
    return StoredStart(columns, worker, set_of, log, number), None
