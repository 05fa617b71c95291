"""The dashboard's live feed (``/api/changes``, server-sent events): objects as they arrive,
result changes, and the service's status, read from Redis without consuming anything.

Each client gets its own cursor on ``knn:ingest:objects`` and ``knn:changes`` (plain XRANGE, no
consumer group: the service's group is untouched), starting at the streams' ends. Every
tick sends at most :data:`MAX_OBJECTS` objects and reads at most :data:`MAX_ENTRIES` feed entries;
a client that falls further behind skips to the end and is told so, so a burst
of 20,000 objects/s costs the dashboard a bounded amount of work.

Events (``event:`` name, ``data:`` JSON):

- ``objects``: ``{"objects": [[id, lon, lat], ...], "behind": bool}`` (``behind``: more arrived
  than a tick sends; the cursor skipped to the stream's end);
- ``changes`` (only with a watched query, ``?qid=``): ``{"entries": n, "query": [[qid, entered
  ids, left ids, version], ...], "behind": bool}``, that query's lines of the ``n`` feed entries
  read (the page reads its result again after a skip); without one the feed is not read;
- ``status``: :func:`~knnmon.coordinator.dashboard.reader.status_view`, every :data:`STATUS_EVERY_S`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from knnmon.coordinator.dashboard.reader import status_view
from knnmon.feed import parse_entry
from knnmon.keys import Keys

__all__ = ["MAX_ENTRIES", "MAX_OBJECTS", "STATUS_EVERY_S", "LiveFeed"]

#: Objects sent per tick at most.
MAX_OBJECTS = 100
#: Change feed entries read per tick at most.
MAX_ENTRIES = 200
#: Seconds between two status events.
STATUS_EVERY_S = 2.0
#: Seconds between two ticks.
TICK_S = 0.25


def _last_id(client: Any, key: str) -> str:
    rows = client.xrevrange(key, count=1)
    return rows[0][0] if rows else "0-0"


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class LiveFeed:
    """One client's cursors on the streams (module docstring).

    Parameters
    ----------
    client
        A redis-py client (``decode_responses=True``).
    url
        The Redis URL (for the status read; never sent to the page).
    keys
        The namespace's keys.
    qid
        The watched query (its result changes are sent), or ``None``.
    """

    def __init__(self, client: Any, url: str, keys: Keys, qid: str | None = None) -> None:
        self.client, self.url, self.keys, self.qid = client, url, keys, qid
        self.objects_at = _last_id(client, keys.ingest_objects)
        self.changes_at = _last_id(client, keys.changes)
        self.status_at = 0.0

    def _objects(self) -> str | None:
        rows = self.client.xrange(self.keys.ingest_objects, min="(" + self.objects_at, max="+", count=MAX_OBJECTS + 1)
        if not rows:
            return None
        behind = len(rows) > MAX_OBJECTS
        if behind:  # skip to the end: the objects in between are not shown
            rows = rows[:MAX_OBJECTS]
            self.objects_at = _last_id(self.client, self.keys.ingest_objects)
        else:
            self.objects_at = rows[-1][0]
        out = []
        for _, f in rows:
            try:
                out.append([str(f.get("id", ""))[:200], float(f["lon"]), float(f["lat"])])
            except (KeyError, TypeError, ValueError):
                continue  # a malformed entry (the service rejects it too)
        return _event("objects", {"objects": out, "behind": behind})

    def _changes(self) -> str | None:
        if self.qid is None:  # nothing watched: the feed is not read at all
            return None
        rows = self.client.xrange(self.keys.changes, min="(" + self.changes_at, max="+", count=MAX_ENTRIES + 1)
        if not rows:
            return None
        behind = len(rows) > MAX_ENTRIES
        rows = rows[:MAX_ENTRIES]
        self.changes_at = _last_id(self.client, self.keys.changes) if behind else rows[-1][0]
        mine, line = [], self.qid + "\t"
        for _, f in rows:
            text = f.get("changes", "")
            if not (text.startswith(line) or "\n" + line in text):  # (most entries: a substring test)
                continue
            try:
                mine += [[q, e, l_, v] for q, e, l_, v in parse_entry(f) if q == self.qid]
            except (KeyError, ValueError):
                continue
        return _event("changes", {"entries": len(rows), "query": mine, "behind": behind})

    def tick(self) -> list[str]:
        """The events of one tick (possibly none)."""
        out = [e for e in (self._objects(), self._changes()) if e]
        now = time.monotonic()
        if now - self.status_at >= STATUS_EVERY_S:
            self.status_at = now
            out.append(_event("status", status_view(self.url, self.client, self.keys)))
        return out

    def events(self, *, ticks: int | None = None) -> Iterator[str]:
        """The event stream: a first status, then :meth:`tick` every :data:`TICK_S` (``ticks``:
        stop after that many, for tests; default forever)."""
        yield ": knnmon live feed\n\n"
        i = 0
        while ticks is None or i < ticks:
            yield from self.tick()
            time.sleep(TICK_S)
            i += 1
