"""Exact under any sequence: a model-based test of ``knnmon serve``.

:class:`Model` is the contract (``docs/concepts.md``'s semantics): the accepted objects, each query
with its last parameters, the window and its watermark (allowed lateness, ``--max-future``), and
which entry is rejected with which reason. :class:`ServeMachine` (``hypothesis.stateful``) drives
the real service -- in this process, with in-process workers, over a real Redis (its own,
append-only file on) -- through random sequences of: query registrations, updates and
unregisters, valid and hostile; batches of real places with re-published ids, late, far-future
and malformed entries and oversized fields; event time jumping past the window; a worker lost
between batches or in the middle of one (before or after its write); the service stopped, or
dropped in the middle of a batch (what SIGKILL leaves in Redis), then started anew; Redis
restarted; a re-plan. After every step it checks, against the model:

- every result equals the brute-force oracle over the live objects;
- the change feed replays to every result, no change was applied twice, and each details hash
  holds exactly its results' objects; nothing is pending, and (without a window) the objects
  stream holds exactly the accepted entries (a reject leaves it);
- each rejected entry is in ``knn:ingest:rejects`` with the model's reason, and no other entry;
- ``knnmon status`` and the Prometheus counters equal each other and the model's counts.

Hypothesis shrinks a failing run to its shortest sequence. The default suite runs a fixed seed;
``KNNMON_MBT_EXAMPLES``, ``KNNMON_MBT_STEPS`` and ``KNNMON_MBT_SEED`` make longer runs. The Ray
variant is ``test_model_based_ray.py``.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from knnmon.coordinator.runtime.config import ARRIVAL_EPOCH_MS, RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.coordinator.service.status import read_status
from tests.support import FeedMirror, assert_exact, assert_feed_and_objects, object_fields, register_fields
from knnmon.errors import WorkerLostError
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.protocol import GROUP
from knnmon.redis_server import EmbeddedRedis
from knnmon.store import StoreConfig
from tests.coordinator.service.mbt_model import Model, hostile_objects, hostile_ops

WORKERS = 3
#: The window of the windowed runs, and the event time between two places of a batch (ms).
WINDOW_MS, STEP_MS = 600_000, 1_000
#: The status counters the model predicts (the service's since its start).
COUNTED = ("registered", "updated", "unchanged", "unregistered", "unregister_unknown", "objects")


class _Crash(BaseException):
    """The service dies here: it leaves ``run()`` as SIGKILL would, with Redis as it was then."""


class ServeMachine(RuleBasedStateMachine):
    """The state machine (module docstring); :attr:`places` and :attr:`pool_queries` are set by
    the test, and :attr:`redis_server` (a durable :class:`EmbeddedRedis`)."""

    places: list[dict] = []
    pool_queries: list[dict] = []
    redis_server: EmbeddedRedis | None = None
    #: Steps checked and faults injected (worker losses, service stops and crashes, Redis
    #: restarts), over every run of the machine in this process.
    tally: Counter = Counter()
    #: How long the status may take to show a step's counts (s).
    status_wait_s: float = 0.0
    #: The fewest steps between two starts of the service (a start on Ray takes seconds).
    steps_per_start: int = 0

    @initialize(window=st.sampled_from([None, WINDOW_MS]), lateness_ms=st.sampled_from([0, 30_000]),
                k_extra=st.integers(0, 3))
    def start(self, window, lateness_ms, k_extra):
        import uuid

        self.keys = Keys(f"m{uuid.uuid4().hex[:8]}")
        self.url = self.redis_server.url
        self.r = redis.Redis.from_url(self.url, decode_responses=True)
        self.raw = redis.Redis.from_url(self.url)
        self.model = Model(window, lateness_ms if window else 0)
        self.k_extra = k_extra
        run = RunConfig(workers=WORKERS, executor="inline", batch=150, window=window,
                        allowed_lateness=self.model.lateness_ms,
                        store=StoreConfig(url=self.url, namespace=self.keys.namespace))
        self.config = ServeConfig(run=run, max_delay_ms=2, block_ms=20, metrics=("127.0.0.1", 0))
        self.next_place = 0
        self.clock = ARRIVAL_EPOCH_MS  # event time of the next place
        self.expected_rejects: dict[str, tuple[str, str]] = {}  # entry id -> (stream, reason), not yet seen
        self.rejects_seen = "0"
        self.feed = FeedMirror()  # (read after every step: the service trims the feed to its last minutes)
        self.svc: Service | None = None
        self.killed: dict[int, object] = {}  # worker -> the lost worker object, until it is revived
        self.revived = 0
        self._start()

    # -- the service ---------------------------------------------------------------------------
    def _start(self, replan: bool = False) -> None:
        self.started_at = self.tally["steps"]
        self.svc = Service(replace(self.config, replan=replan)).start()
        self.killed, self.revived, self.pool = {}, 0, self.svc.runtime.pool
        self.model.counts = Counter()
        self._serve()
        self.model.counts = Counter()  # (what recovery applied again is not the model's to count)
        self.baseline = self._counts()

    def _serve(self) -> None:
        """Run the service until it has applied everything waiting and is idle."""
        self.svc.run(idle_exit_s=0.05, handle_signals=False)

    def _stop(self) -> None:
        if self.svc is not None:
            self.svc.close()
            self.svc = None

    def teardown(self):
        """Stop the service (on Ray, it kills its detached workers); Redis is emptied, its
        append-only file rewritten (a restart then loads nothing of the examples before)."""
        self._stop()
        self.r.flushall()
        self.r.bgrewriteaof()

    def _arm(self, fail: BaseException, before: bool, *, worker: int | None = None, j: int = 0) -> None:
        """Worker ``worker``'s next batch call (or, with no ``worker``, the ``j``-th (0-based) of
        all workers') raises ``fail``, after the worker applied and wrote it (``before=False``)
        or before."""
        calls = [0]
        for w, victim in enumerate(self.svc.runtime.pool.workers):
            if worker is not None and w != worker:
                continue
            original = victim.process_rows

            def dying(*args, _original=original, **kwargs):
                calls[0] += 1
                if calls[0] - 1 != j:
                    return _original(*args, **kwargs)
                if not before:
                    _original(*args, **kwargs)
                raise fail

            victim.process_rows = dying

    def _disarm(self) -> None:
        for worker in self.svc.runtime.pool.workers:
            worker.__dict__.pop("process_rows", None)

    # -- what clients send ---------------------------------------------------------------------
    def _places(self, n: int) -> list[dict]:
        """The next ``n`` real places, at the event clock, one :data:`STEP_MS` apart."""
        out = []
        for _ in range(n):
            p = self.places[self.next_place % len(self.places)]
            # (each pass over the places gets new ids: an id is never re-published after it expired)
            suffix = f"~{self.next_place // len(self.places)}" if self.next_place >= len(self.places) else ""
            out.append({**p, "id": p["id"] + suffix, "t": self.clock})
            self.next_place += 1
            self.clock += STEP_MS
        return out

    def _xadd(self, stream: str, fields: dict) -> str:
        client = self.raw if any(isinstance(v, bytes) for v in fields.values()) else self.r
        eid = client.xadd(stream, fields)
        return eid.decode() if isinstance(eid, bytes) else eid

    def _query(self, i: int, k: int | None = None) -> dict:
        q = self.pool_queries[i % len(self.pool_queries)]
        return {**q, "k": k or min(q["k"] + self.k_extra, 12)}

    # -- rules ---------------------------------------------------------------------------------
    @rule(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=12), k=st.one_of(st.none(), st.integers(1, 15)))
    def register(self, picks, k):
        for i in picks:
            q = self._query(i, k)
            self._xadd(self.keys.ingest_queries, register_fields(q))
            self.model.register(q)
        self._serve()

    @precondition(lambda self: self.model.queries)
    @rule(data=st.data(), unknown=st.booleans())
    def unregister(self, data, unknown):
        qid = "never-registered" if unknown else data.draw(st.sampled_from(sorted(self.model.queries)))
        self._xadd(self.keys.ingest_queries, {"op": "unregister", "id": qid})
        self.model.unregister(qid)
        self._serve()

    @rule(which=st.lists(st.integers(0, 100), min_size=1, max_size=4), objects=st.booleans())
    def hostile(self, which, objects):
        """Entries each rejected with a reason (they change nothing else)."""
        if objects:
            cases, stream, name = hostile_objects(self._places(1)[0]), self.keys.ingest_objects, "objects"
        else:
            cases, stream, name = hostile_ops(self._query(which[0])), self.keys.ingest_queries, "queries"
        for i in which:
            fields, reason = cases[i % len(cases)]
            self.expected_rejects[self._xadd(stream, fields)] = (stream, reason)
            self.model.reject(name, reason)
        self._serve()

    @rule(n=st.integers(1, 400), dups=st.integers(0, 3), late=st.integers(0, 3), jump=st.sampled_from([0, 0, 1, 2]))
    def publish(self, n, dups, late, jump, serve=True):
        """``n`` new places (after a jump of ``jump`` windows of event time, or 20 minutes
        without a window), ``dups`` re-published ids and ``late`` places older than the window;
        then served (unless not ``serve``)."""
        m = self.model
        self.clock += jump * (m.window_ms or 1_200_000)
        fresh = self._places(n)
        top = max(m.top_t or fresh[-1]["t"], fresh[-1]["t"])
        cut = m.cutoff(top)
        entries: list[tuple[dict, str | None]] = [(o, None) for o in fresh]
        # Re-published ids: of objects that stay live after this batch, or of this batch's own.
        alive = [o for o in m.objects.values() if cut is None or o["t"] > cut] + fresh
        for i in range(dups):  # (after their first entries: the first one counts)
            o = alive[(i * 7919) % len(alive)]
            entries.append(({**o, "lon": o["lon"] + 0.01}, "duplicate_id"))
        if cut is not None and m.cutoff() is not None:  # late: at or below the cutoff before this batch
            for i in range(late):
                o = self.places[(self.next_place + 7 * i) % len(self.places)]
                entries.insert(i, ({**o, "id": f"late-{self.next_place}-{i}", "t": m.cutoff() - 5_000 * i}, "late"))
        pipe = self.r.pipeline(transaction=False)
        for o, _ in entries:
            pipe.xadd(self.keys.ingest_objects, object_fields(o))
        for eid, (o, reason) in zip(pipe.execute(), entries):
            if reason is not None:
                self.expected_rejects[eid] = (self.keys.ingest_objects, reason)
                m.reject("objects", reason)
        m.accept(fresh)
        if serve:
            self._serve()

    @rule(worker=st.integers(0, WORKERS - 1), during=st.booleans(), before=st.booleans(), n=st.integers(50, 300))
    def lose_worker(self, worker, during, before, n):
        """A worker lost between batches (found by the next call that needs it) or during one
        (before or after its write); then a batch of ``n`` places."""
        self._lose(worker, during, before)
        self.tally["faults"] += 1
        self.publish(n, 0, 0, 0)
        self._lost()

    @precondition(lambda self: self.tally["steps"] >= self.started_at + self.steps_per_start)
    @rule(crash=st.booleans(), j=st.integers(0, WORKERS - 1), before=st.booleans(), n=st.integers(50, 300),
          replan=st.booleans())
    def restart(self, crash, j, before, n, replan):
        """The service stopped (or dropped in the middle of a batch: ``crash``), then started
        anew over the same Redis (``replan``: every query planned anew)."""
        if crash:
            self._crash(j, before, n)
        self.tally["faults"] += 1
        self._stop()
        self._start(replan=replan)

    # -- faults, in process: a worker's call fails, the service leaves run() ---------------------
    def _lose(self, worker: int, during: bool, before: bool) -> None:
        pool = self.svc.runtime.pool
        if during:
            self._arm(WorkerLostError(worker, "lost in the middle of a batch (test)"), before, worker=worker)
        else:
            pool.kill(worker)
        self.killed[worker] = pool.workers[worker]

    def _lost(self) -> None:
        self._disarm()

    def _crash(self, j: int, before: bool, n: int) -> None:
        """Worker batch call ``j`` of the next batch kills the service (Redis as it was then;
        :meth:`_stop` closes what is left in this process)."""
        self._arm(_Crash(), before, j=j)
        self.publish(n, 0, 0, 0, serve=False)
        try:
            self._serve()
        except _Crash:
            pass

    def _revived(self) -> int | None:
        """The workers revived in place since the service started, as the test saw them replaced."""
        pool = self.svc.runtime.pool
        if pool is not self.pool:  # every worker started anew (a rebuild from Redis): none revived in place
            self.pool, self.killed = pool, {}
        for w, lost in list(self.killed.items()):
            if pool.workers[w] is not lost and w not in pool.lost:
                self.revived += 1
                del self.killed[w]
        return self.revived

    @rule()
    def restart_redis(self):
        """Redis stops (saving its data) and starts again on the same port while the service
        waits between reads; the service finds it restarted and checks it kept every write."""
        self.redis_server.stop()
        self.redis_server.start()
        self.tally["faults"] += 1
        self._serve()

    # -- checks --------------------------------------------------------------------------------
    def _counts(self) -> Counter:
        """The service's counts as its status says them, checked equal to its ``/metrics``
        (rejects by stream and reason: ``/metrics`` alone splits them by stream)."""
        status = read_status(self.url, self.keys.namespace)["service"]
        got = Counter({k: status[k] for k in (*COUNTED, "workers_revived")})
        scrape = _scrape(f"http://{status['metrics']}/metrics")
        names = {"objects": "knnmon_objects_applied_total", "registered": "knnmon_queries_registered_total",
                 "updated": "knnmon_queries_updated_total", "unregistered": "knnmon_queries_unregistered_total",
                 "workers_revived": "knnmon_workers_revived_total"}
        for key, name in names.items():
            assert scrape[name, ""] == got[key], (name, scrape[name, ""], got[key])
        for stream, name in (("objects", "knnmon_objects_rejected_total"),
                             ("queries", "knnmon_query_operations_rejected_total")):
            got.update({(stream, r): n for (m, r), n in scrape.items() if m == name and n})
        by_reason = Counter()
        for (_, reason), n in ((k, n) for k, n in got.items() if isinstance(k, tuple)):
            by_reason[reason] += n
        assert by_reason == Counter(status["rejects_by_reason"])
        return got

    @invariant()
    def exact(self):
        if getattr(self, "svc", None) is None:
            return
        self.tally["steps"] += 1
        m, r, keys = self.model, self.r, self.keys
        # Every result equals the oracle over the live objects.
        queries = list(m.queries.values())
        assert set(r.smembers(keys.queries)) == set(m.queries)
        if queries:
            live = m.live()
            table = pa.Table.from_pylist(live) if live else pa.table(
                {"id": pa.array([], pa.string()), "lon": pa.array([], pa.float64()), "lat": pa.array([], pa.float64()),
                 "keywords": pa.array([], pa.list_(pa.string()))})
            assert_exact(self.url, keys.namespace, pa.Table.from_pylist(queries), BruteForceKnn(table))
        # The feed replays to every result, nothing applied twice, the details hashes exact.
        assert_feed_and_objects(r, keys, sorted(m.queries), self.feed)
        # Nothing pending; a stream holds what was applied only.
        for key in (keys.ingest_objects, keys.ingest_queries):
            if r.exists(key):
                assert r.xpending(key, GROUP)["pending"] == 0
        if m.window_ms is None:
            assert r.xlen(keys.ingest_objects) == m.accepted_entries
        # Each rejected entry is in the rejects stream with the model's reason (and no other one).
        for eid, f in r.xrange(keys.ingest_rejects, min="(" + self.rejects_seen if self.rejects_seen != "0" else "-"):
            self.rejects_seen = eid
            want = self.expected_rejects.pop(f["_entry"], None)
            assert want == (f["_stream"], f["_reason"]), (f["_entry"], f["_stream"], f["_reason"], f["_detail"], want)
        assert not self.expected_rejects, f"entries not rejected: {self.expected_rejects}"
        # The status and /metrics count what the model does (since the service started). (A
        # service in another process publishes its status when its work runs out: waited for.)
        want = Counter(m.counts)
        revived = self._revived()
        if revived is not None:  # (else not known to the test: not compared)
            want["workers_revived"] = revived
        deadline = time.monotonic() + self.status_wait_s
        while True:
            try:
                got = self._counts()
                delta = Counter({k: got[k] - self.baseline[k] for k in set(got) | set(self.baseline)})
                if revived is None:
                    delta.pop("workers_revived", None)
                assert +delta == +want, (+delta, +want)
                return
            except (AssertionError, OSError):  # (OSError: /metrics not answering)
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)


def _scrape(url: str) -> dict[tuple[str, str], float]:
    """A scrape of ``/metrics`` by (metric, its reason label or "")."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, s.labels.get("reason", "")): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


@pytest.fixture(scope="module")
def mbt_data(places_slice, slice_queries):
    return (stream_order(read_objects(str(places_slice)), None).to_pylist(),
            pq.read_table(slice_queries).slice(0, 400).to_pylist())


def _run(base: type[ServeMachine], mbt_data, tmp_path, examples: int, steps: int, **attrs) -> None:
    places, queries = mbt_data
    examples = int(os.environ.get("KNNMON_MBT_EXAMPLES", examples))
    steps = int(os.environ.get("KNNMON_MBT_STEPS", steps))
    with EmbeddedRedis(str(tmp_path / "redis"), durable=True) as server:
        machine = type("Machine", (base,), {"places": places, "pool_queries": queries, "redis_server": server,
                                            "log_dir": str(tmp_path), **attrs})
        machine = seed(int(os.environ.get("KNNMON_MBT_SEED", "20261128")))(machine)
        t0 = time.monotonic()
        ServeMachine.tally.clear()
        try:
            run_state_machine_as_test(machine, settings=settings(
                max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True))
        finally:
            print(f"\nmodel-based test ({base.__name__}): {ServeMachine.tally['steps']:,} steps checked, "
                  f"{ServeMachine.tally['faults']:,} faults, in {time.monotonic() - t0:.0f} s")


def test_the_service_is_exact_under_any_sequence(mbt_data, tmp_path):
    _run(ServeMachine, mbt_data, tmp_path, examples=5, steps=15)
