"""The model of ``test_model_based.py``: what the service must hold and say (the semantics of
``docs/concepts.md``), and the hostile entries with the reason each is rejected for."""

from __future__ import annotations

import time
from collections import Counter

from tests.support import object_fields, register_fields


def hostile_objects(valid: dict) -> list[tuple[dict, str]]:
    """Object entries each rejected with its reason (fields built from a valid place)."""
    f = object_fields(valid)
    return [
        ({k: v for k, v in f.items() if k != "id"}, "missing_id"),
        ({**f, "id": "a b"}, "bad_id"),
        ({**f, "id": "x" * 300}, "bad_id"),
        ({k: v for k, v in f.items() if k != "lat"}, "missing_coordinates"),
        ({**f, "lon": "east"}, "non_numeric_coordinates"),
        ({**f, "lon": "inf"}, "non_numeric_coordinates"),
        ({**f, "lon": "200"}, "longitude_out_of_range"),
        ({**f, "lat": "-95"}, "latitude_out_of_range"),
        ({**f, "lon": "0", "lat": "0"}, "null_island"),
        ({**f, "t": "noon"}, "bad_time"),
        ({**f, "t": "9" * 25}, "bad_time"),
        ({**f, "t": str(int(time.time() * 1000) + 3_600_000)}, "future"),  # valid alone: would move the watermark
        ({k: v for k, v in f.items() if k != "keywords"}, "no_keywords"),
        ({**{k: v for k, v in f.items() if k != "keywords"}, "text": "the of and 42"}, "no_keywords"),  # (normalised)
        ({**f, "keywords": " ".join(f"w{i}" for i in range(40))}, "too_many_keywords"),
        ({**f, "keywords": "x " * 40_000}, "field_too_large"),
        ({**f, "text": "t" * 1_000_000}, "field_too_large"),  # 1 MB: leaves the stream as any reject
        ({**f, "keywords": b"caf\xe9"}, "not_utf8"),
    ]


def hostile_ops(q: dict) -> list[tuple[dict, str]]:
    """Query operations each rejected with its reason (fields built from a valid query)."""
    f = register_fields(q)
    return [
        ({**f, "op": "fly"}, "unknown_op"),
        ({k: v for k, v in f.items() if k != "op"}, "unknown_op"),
        ({**f, "k": "0"}, "bad_k"),
        ({**f, "k": "two"}, "bad_k"),
        ({**f, "k": "99999999999999999999"}, "k_too_large"),
        ({k: v for k, v in f.items() if k != "lon"}, "missing_coordinates"),
        ({**f, "lon": "0", "lat": "0"}, "null_island"),
        ({**f, "id": "{tag}"}, "bad_id"),
        ({**f, "id": ""}, "missing_id"),
        ({**f, "keywords": "the of"}, "no_keywords"),
        ({**f, "keywords": " ".join(f"w{i}" for i in range(40))}, "too_many_keywords"),
        ({**f, "keywords": "k" * 70_000}, "field_too_large"),
        ({**f, "id": b"q\xff"}, "not_utf8"),
    ]


class Model:
    """What the service must hold and say (module docstring)."""

    def __init__(self, window_ms: int | None, lateness_ms: int) -> None:
        self.window_ms, self.lateness_ms = window_ms, lateness_ms
        self.objects: dict[str, dict] = {}  # accepted (with a window: those still live, and maybe expired)
        self.queries: dict[str, dict] = {}
        self.top_t: int | None = None  # the largest t applied
        self.accepted_entries = 0
        self.counts: Counter = Counter()  # COUNTED and rejects (stream, reason), since the service started

    def cutoff(self, top_t: int | None = None) -> int | None:
        """Objects with ``t`` at or below this are expired (``None``: none is)."""
        top = self.top_t if top_t is None else top_t
        return None if self.window_ms is None or top is None else top - self.lateness_ms - self.window_ms

    def live(self) -> list[dict]:
        cut = self.cutoff()
        return [o for o in self.objects.values() if cut is None or o["t"] > cut]

    def register(self, q: dict) -> None:
        old = self.queries.get(q["id"])
        same = old is not None and (old["lon"], old["lat"], sorted(old["keywords"]), old["k"]) == (
            q["lon"], q["lat"], sorted(q["keywords"]), q["k"])
        if same:
            self.counts["unchanged"] += 1
            return
        self.counts["registered"] += 1  # (an update is a registration too, that replaced one)
        self.counts["updated"] += old is not None
        self.queries[q["id"]] = q

    def unregister(self, qid: str) -> None:
        self.counts["unregister_unknown" if self.queries.pop(qid, None) is None else "unregistered"] += 1

    def accept(self, objects: list[dict]) -> None:
        for o in objects:
            self.objects[o["id"]] = o
            self.top_t = o["t"] if self.top_t is None else max(self.top_t, o["t"])
        self.accepted_entries += len(objects)
        self.counts["objects"] += len(objects)
        cut = self.cutoff()
        if cut is not None:  # (an expired id is forgotten by the model; the machine never re-publishes one)
            self.objects = {i: o for i, o in self.objects.items() if o["t"] > cut}

    def reject(self, stream: str, reason: str) -> None:
        self.counts[stream, reason] += 1
