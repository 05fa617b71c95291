"""The chaos soak's checks (:mod:`tests.system.chaos_soak`): a sample of the registered queries against the
brute-force oracle over the live objects the service accepted, the change feed (nothing applied
twice), and what the publisher recorded against what the service accepted.

Publishing pauses only while the snapshot is taken: until the service caught up, then the rest
of the objects stream is read (:class:`AcceptedMirror` read the rest as it arrived) and the
sampled results are read. The feed's check runs after publishing resumed; the oracle and the
comparison after the soak (:func:`verify`): the oracle takes 20-40 s of CPU, which, run beside
the stream, took a core from the service (the soak at d25dd3e: lag samples of 6-9 s there).

A pause is a stream that stops: with entries taking their arrival time, the first entry after
it moves the watermark by the whole pause and expires as many seconds of objects at once
(docs/window.md: a check that paused ~30 s gave the next minute a refill wave of ~30,000 objects).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import redis

from tests.system.chaos_faults import NAMESPACE, Chaos
from tests.system.chaos_load import Publisher
from tests.system.soak import caught_up

from knnmon.coordinator.service.status import read_status
from tests.support import assert_applied_once, expected, first_mismatch, redis_results
from knnmon.errors import Rejected
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.protocol import entry_order, parse_object

__all__ = ["AcceptedMirror", "Snapshot", "check", "queries_done", "verify"]


class AcceptedMirror(threading.Thread):
    """The objects stream's well-formed entries, read every ``every_s`` as they arrive (before a
    checkpoint trims them), those older than ``keep_ms`` behind the newest dropped (a new list:
    a snapshot's copy keeps its own).

    Only entries that parse are kept; which of them the service rejected (duplicates, late,
    future) is read from the rejects stream at the check (:func:`check`)."""

    def __init__(self, url: str, keys: Keys, keep_ms: int, every_s: float = 2.0) -> None:
        super().__init__(daemon=True, name="accepted-mirror")
        self.r = redis.Redis.from_url(url, decode_responses=True, encoding_errors="surrogateescape", socket_timeout=30)
        self.keys, self.keep_ms, self.every_s = keys, keep_ms, every_s
        self.rows: list[dict] = []
        self.last = "-"
        self.lock, self._stop_event = threading.Lock(), threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every_s):
            try:
                self.read()
            except (redis.RedisError, OSError):  # (Redis away during its restart: read on later)
                pass

    def read(self, chunk: int = 20_000) -> None:
        """Read every entry after the last one read, then drop those older than ``keep_ms``."""
        with self.lock:
            while True:
                got = self.r.xrange(self.keys.ingest_objects, min=self.last, max="+", count=chunk)
                for eid, fields in got:
                    try:
                        o = parse_object(eid, fields)
                    except Rejected:
                        continue
                    self.rows.append({"entry": eid, "id": o.id, "lon": o.lon, "lat": o.lat, "t": o.t,
                                      "keywords": list(o.keywords)})
                if got:
                    self.last = "(" + got[-1][0]
                if len(got) < chunk:
                    break
            if self.rows:
                newest = max(x["t"] for x in self.rows[-chunk:])
                self.rows = [x for x in self.rows if x["t"] > newest - self.keep_ms] \
                    if self.rows[0]["t"] <= newest - 2 * self.keep_ms else self.rows

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=60)


def queries_done(url: str) -> bool:
    """Every query operation published was applied and acknowledged."""
    s = read_status(url, NAMESPACE)["queries_stream"]
    return not s["pending"] and not s["undelivered"]


@dataclass
class Snapshot:
    """What a check read while publishing paused (:func:`check`), verified by :func:`verify`."""

    out: dict
    sample: pa.Table
    got: list
    upto: str
    rows: list[dict]
    rejected: set[tuple[str, str]]
    known: int  # the publisher's records then: pub.published[:known]


def check(chaos: Chaos, r: redis.Redis, keys: Keys, pub: Publisher, mirror: AcceptedMirror, queries: pa.Table,
          label: str, timeout_s: float) -> Snapshot:
    """Pause publishing until the service caught up, take the snapshot (module docstring) and
    resume; then check the change feed. The oracle's comparison waits for :func:`verify`, after
    the soak: its seconds of CPU would compete with the service on this machine's two cores."""
    t0 = time.monotonic()
    pub.pause()
    last = pub.published[-1][0] if pub.published else "0-0"
    out: dict = {"label": label, "exact": None}
    snap = None
    try:
        while not (caught_up(r, keys, last) and queries_done(chaos.url)) and time.monotonic() - t0 < timeout_s:
            time.sleep(0.5)
        out["caught_up_s"] = round(time.monotonic() - t0, 1)
        if not caught_up(r, keys, last):
            out["error"] = "not caught up"
        else:
            mirror.read()
            upto = r.xinfo_stream(keys.ingest_objects)["last-generated-id"]
            alive = pa.concat_tables([queries, pa.Table.from_pylist(pub.churn_alive, schema=queries.schema)]) \
                if pub.churn_alive else queries
            rng = np.random.default_rng(len(pub.published))
            sample = alive.take(pa.array(np.sort(rng.choice(alive.num_rows, min(chaos.a.check, alive.num_rows),
                                                             replace=False))))
            got = redis_results(chaos.url, NAMESPACE, sample.column("id").to_pylist())
            with mirror.lock:
                rows = list(mirror.rows)
            snap = Snapshot(out, sample, got, upto, rows, set(), len(pub.published))
    finally:
        out["paused_s"] = round(time.monotonic() - t0, 1)
        pub.resume()
    if snap is None:
        print(json.dumps(out), flush=True)
        return Snapshot(out, queries.slice(0, 0), [], "0-0", [], set(), 0)
    # (by stream and entry: the two ingest streams hand out the same entry ids, and a rejected
    # query's id hid an accepted object from the oracle in the 100 k soak)
    snap.rejected = {(f["_stream"], f["_entry"]) for _, f in r.xrange(keys.ingest_rejects)}
    try:
        assert_applied_once(r, keys)
        out["applied_once"] = True
    except AssertionError as ex:
        out["applied_once"], out["error_feed"] = False, str(ex)[:500]
    print(json.dumps(out), flush=True)
    return snap


def verify(snap: Snapshot, keys: Keys, pub: Publisher, window_ms: int) -> dict:
    """Compare a snapshot's results with the oracle over the objects it knew were accepted and
    live (up to its last entry, not rejected, live at the newest one's time); count the
    accepted entries the publisher had not recorded. Returns the check's record."""
    out = snap.out
    if not snap.rows:
        return out
    t0 = time.monotonic()
    last = entry_order(snap.upto)
    rows = [x for x in snap.rows if (keys.ingest_objects, x["entry"]) not in snap.rejected
            and entry_order(x["entry"]) <= last]
    table = pa.Table.from_pylist(rows)
    t = table.column("t").to_numpy()
    table = table.filter(pa.array(t > t.max() - window_ms))
    known = {e for e, _ in pub.published[:snap.known]}
    out["accepted_not_recorded"] = sum(1 for e in table.column("entry").to_pylist() if e not in known)
    out["live_objects"] = table.num_rows
    wrong = first_mismatch(snap.sample.column("id").to_pylist(), snap.got,
                           expected(snap.sample, BruteForceKnn(table)))
    out["exact"] = wrong is None
    if wrong is not None:
        out["error"] = wrong[:2000]
    out["check_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out), flush=True)
    return out
