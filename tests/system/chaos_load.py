"""The chaos soak's load (:mod:`tests.system.chaos_soak`): hostile entries with the reason each must get, the
publisher (objects at a rate, a hostile share, query churn; pauses; rides out Redis being away)
and the prefill of the window."""

from __future__ import annotations

import argparse
import random
import threading
import time

import redis

from tests.support import register_fields
from knnmon.keys import Keys
from knnmon.limits import DEFAULT_LIMITS


def hostile_object(i: int, good: dict, now_ms: int) -> tuple[dict, str]:
    """The ``i``-th hostile object entry (cycling through the kinds) and the reason it must get."""
    base = {"id": f"hostile-{i}", "lon": repr(good["lon"]), "lat": repr(good["lat"]),
            "keywords": " ".join(good["keywords"][:8])}  # (a place may carry more than --max-keywords)
    kinds = [
        ({**base, "keywords": "x" * 70_000}, "field_too_large"),
        ({**base, "keywords": b"caf\xff\xfe"}, "not_utf8"),
        ({k: v for k, v in base.items() if k != "id"}, "missing_id"),
        ({**base, "id": f"hostile {i}"}, "bad_id"),
        ({k: v for k, v in base.items() if k != "lat"}, "missing_coordinates"),
        ({**base, "lon": "nan"}, "non_numeric_coordinates"),
        ({**base, "lon": "200"}, "longitude_out_of_range"),
        ({**base, "lat": "-95"}, "latitude_out_of_range"),
        ({**base, "lon": "0", "lat": "0"}, "null_island"),
        ({**base, "t": "9" * 30}, "bad_time"),
        ({**base, "t": str(now_ms + 10 * 365 * 86_400_000)}, "future"),  # far future: would expire everything
        ({**base, "t": "1"}, "late"),  # far past: 1970
        ({**base, "keywords": "   "}, "no_keywords"),
        ({**base, "keywords": " ".join(f"w{j}" for j in range(40))}, "too_many_keywords"),
        ({**base, "id": good["id"]}, "duplicate_id"),  # an id accepted just before
    ]
    return kinds[i % len(kinds)]


def hostile_query(i: int, good: dict) -> tuple[dict, str]:
    """The ``i``-th hostile query operation and the reason it must get."""
    base = {**register_fields(good), "id": f"hq-{i}"}
    kinds = [
        ({**base, "op": "explode"}, "unknown_op"),
        ({**base, "k": "0"}, "bad_k"),
        ({**base, "k": str(10 ** 12)}, "k_too_large"),  # huge k
        ({**base, "lon": "-181"}, "longitude_out_of_range"),
        ({**base, "keywords": "y" * 70_000}, "field_too_large"),
    ]
    return kinds[i % len(kinds)]


class Publisher(threading.Thread):
    """XADDs objects without ``t`` at ``rate``/s (places again under new ids when the stream runs
    out), a ``hostile`` share of them hostile, and ``churn`` registrations + unregisters per
    second; pauses on request (the paused time does not count toward the rate), and rides out
    Redis being away (what it could not publish is not published)."""

    def __init__(self, url: str, keys: Keys, rows: list[dict], extra_queries: list[dict], a: argparse.Namespace,
                 deadline: float) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        self.keys, self.rows, self.extra, self.a, self.deadline = keys, rows, extra_queries, a, deadline
        self.sent = self.hostile_sent = 0
        self.published: list[tuple[str, dict]] = []  # (entry id, object) of the good objects
        self.accepted: dict | None = None  # the last good object the service accepts (its id repeated: duplicate_id)
        self.hostile: list[tuple[str, str, str]] = []  # (stream, entry id, expected reason)
        self.churn_alive: list[dict] = []  # queries registered by the churn and not unregistered
        self.errors = 0
        self.stop, self.running = threading.Event(), threading.Event()
        self.running.set()
        self.idle = threading.Event()
        self._rng = random.Random(7)

    def pause(self) -> None:
        self.running.clear()
        self.idle.wait(30)

    def resume(self) -> None:
        self.idle.clear()
        self.running.set()

    def run(self) -> None:
        a, keys = self.a, self.keys
        chunk = max(1, int(a.rate / 100))
        clock, counted, churned, hq = time.monotonic(), 0, 0, 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            if not self.running.is_set():
                self.idle.set()
                self.running.wait()
                clock, counted = time.monotonic(), 0  # the pause does not count toward the rate
                continue
            ahead = counted / a.rate - (time.monotonic() - clock)
            if ahead > 0:
                time.sleep(ahead)
            batch, now_ms = [], int(time.time() * 1000)
            try:
                pipe = self.r.pipeline(transaction=False)
                for _ in range(chunk):
                    i = self.sent
                    o = self.rows[i % len(self.rows)]
                    o = {**o, "id": f"{o['id']}#{i // len(self.rows)}"}
                    if self._rng.random() < a.hostile and self.accepted is not None:
                        fields, reason = hostile_object(self.hostile_sent, self.accepted, now_ms)
                        batch.append(("hostile", reason))
                        self.hostile_sent += 1
                    else:
                        fields = {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]),
                                  "keywords": " ".join(o["keywords"])}
                        batch.append(("good", o))
                        self.sent += 1
                    pipe.xadd(keys.ingest_objects, fields)
                due = int((time.monotonic() - clock) * a.churn_per_s)
                while churned < due and self.extra:  # one registration and one unregister
                    q = self.extra.pop()
                    if self._rng.random() < a.hostile * 20:
                        fields, reason = hostile_query(hq, q)
                        hq += 1
                        batch.append(("hostile-query", reason))
                        pipe.xadd(keys.ingest_queries, fields)
                    pipe.xadd(keys.ingest_queries, register_fields(q))
                    batch.append(("register", q))
                    if len(self.churn_alive) > 50:
                        gone = self.churn_alive.pop(self._rng.randrange(len(self.churn_alive)))
                        pipe.xadd(keys.ingest_queries, {"op": "unregister", "id": gone["id"]})
                        batch.append(("unregister", gone))
                    churned += 1
                for eid, (kind, what) in zip(pipe.execute(), batch):
                    if kind == "good":
                        self.published.append((eid, what))
                        if 0 < len(set(" ".join(what["keywords"]).lower().split())) <= DEFAULT_LIMITS.max_keywords:
                            self.accepted = what  # (a place with more keywords is rejected: no id to repeat)
                    elif kind == "hostile":
                        self.hostile.append((keys.ingest_objects, eid, what))
                    elif kind == "hostile-query":
                        self.hostile.append((keys.ingest_queries, eid, what))
                    elif kind == "register":
                        self.churn_alive.append(what)
            except (redis.ConnectionError, redis.TimeoutError):
                self.errors += 1  # Redis away: this chunk is not published (or only partly: unknown ids)
                time.sleep(0.5)
            counted += chunk
        self.idle.set()


def publish_prefill(r: redis.Redis, keys: Keys, rows: list[dict], since_ms: int, until_ms: int, tag: str,
                    chunk: int = 5000) -> list[tuple[str, dict]]:
    """Publish ``rows`` with times spread evenly over ``(since_ms, until_ms]`` (under ids
    ``<id>#<tag>``), as a service that has run that long holds them; returns ``(entry id,
    object with its t)`` of each."""
    step = (until_ms - since_ms) / max(len(rows), 1)
    out = []
    for s in range(0, len(rows), chunk):
        pipe, part = r.pipeline(transaction=False), []
        for i in range(s, min(s + chunk, len(rows))):
            o = {**rows[i], "id": f"{rows[i]['id']}#{tag}", "t": since_ms + int((i + 1) * step)}
            part.append(o)
            pipe.xadd(keys.ingest_objects, {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]),
                                            "t": str(o["t"]), "keywords": " ".join(o["keywords"])})
        out += list(zip(pipe.execute(), part))
    return out
