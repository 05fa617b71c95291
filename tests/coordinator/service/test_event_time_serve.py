"""Event time in ``knnmon serve``: hostile entries (a ``t`` from the future, an entry id from the
future, a duplicate id of an object in a result, a query id with a hash tag, a forged query hash)
are rejected or left out and change nothing else: the results, the watermark and the change
feed's lines equal those of a twin namespace that never saw them, and match the brute-force
oracle. A state poisoned by an earlier version is refused at start and repaired."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.coordinator.service.repair import repair_watermark
from knnmon.coordinator.service.status import format_status, read_status
from knnmon.errors import PoisonedWatermarkError
from knnmon.ingest.reading import read_objects, stream_order
from knnmon.keys import Keys
from knnmon.limits import Limits
from knnmon.oracle import BruteForceKnn
from knnmon.store import StoreConfig
from tests.support import assert_exact, knnmon_cli, object_fields, redis_results, register_fields

SECOND = 1000
FAR = "9000000000000000000"


@pytest.fixture(scope="module")
def timed(places_slice, slice_queries):
    """3,000 places, one a second, the newest a second ago; 200 queries."""
    objects = stream_order(read_objects(str(places_slice)), None).slice(0, 3000)
    start = int(time.time() * 1000) - 3001 * SECOND
    t = start + SECOND * pa.array(range(objects.num_rows), pa.int64()).to_numpy()
    objects = objects.set_column(objects.column_names.index("t"), "t", pa.array(t))
    return objects, pq.read_table(slice_queries).slice(0, 200)


def serve(url: str, namespace: str, *, window=None, lateness=0, limits=Limits()) -> Service:
    run = RunConfig(workers=2, executor="inline", batch=200, window=window, allowed_lateness=lateness, limits=limits,
                    store=StoreConfig(url=url, namespace=namespace))
    config = ServeConfig(run=run, batching="no-wait", checkpoint_interval_s=3600.0)
    return Service(config)


def drain(svc: Service) -> None:
    """Serve until idle; again on the next call."""
    svc.run(idle_exit_s=0.3, handle_signals=False)


def publish(r: redis.Redis, keys: Keys, entries: list[dict]) -> None:
    """XADD ``entries`` atomically: the service reads them in deterministic batches."""
    pipe = r.pipeline(transaction=True)
    for f in entries:
        pipe.xadd(keys.ingest_objects, f)
    pipe.execute()


def registered(url: str, namespace: str, queries: pa.Table) -> tuple[redis.Redis, Keys]:
    """A client, and the namespace's keys with ``queries`` waiting in its queries stream."""
    r = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(namespace)
    for q in queries.to_pylist():
        r.xadd(keys.ingest_queries, register_fields(q))
    return r, keys


def feed_lines(r: redis.Redis, keys: Keys) -> list[tuple[int, list[str]]]:
    by_version = defaultdict(list)
    for _, f in r.xrange(keys.changes):
        by_version[int(f["version"])] += [x for x in f["changes"].split("\n") if x]
    return sorted((v, sorted(lines)) for v, lines in by_version.items())


@pytest.mark.parametrize("window, lateness", [pytest.param(None, 0, marks=pytest.mark.slow),
                                              pytest.param(1500 * SECOND, 0, marks=pytest.mark.slow),
                                              (1500 * SECOND, 300 * SECOND)])  # (5 s each; the model-based
# test publishes hostile entries with and without a window too)
def test_hostile_entries_change_nothing_else(redis_url, timed, window, lateness):
    objects, queries = timed
    rows = objects.to_pylist()
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    top = rows[-1]["t"]
    # Out of order, in both namespaces: 100 s behind the lateness-free cutoff, and 100 s behind
    # the cutoff with 300 s of lateness.
    stale = [{**rows[0], "id": "stale-near", "t": top - 1500 * SECOND - 100 * SECOND},
             {**rows[1], "id": "stale-far", "t": top - 1500 * SECOND - 400 * SECOND}] if window else []
    states = {}
    for name in ("twin", "hostile"):
        ns = f"evt{time.monotonic_ns()}"
        r, keys = registered(redis_url, ns, queries)
        with serve(redis_url, ns, window=window, lateness=lateness) as svc:
            publish(r, keys, [object_fields(o) for o in rows[:2000]])
            drain(svc)
            if name == "hostile":
                q0 = queries.to_pylist()[0]
                held = r.zrange(keys.result(q0["id"]), 0, 0)[0]
                near = {"id": "evil", "lon": repr(q0["lon"]), "lat": repr(q0["lat"]),
                        "keywords": " ".join(q0["keywords"])}
                publish(r, keys, [{**near, "t": FAR},  # the watermark to the end of time
                                  {**near, "id": "evil-hour", "t": str(int(time.time() * 1000) + 3_600_000)},
                                  {**near, "id": held}])  # an object in a result, again, nearer
                r.xadd(keys.ingest_queries, {**register_fields(q0), "id": "{knn}evil"})
                drain(svc)
                assert svc.counters["future"] == 2, (svc.counters, svc.life.ledger.rejects_by_reason)
            publish(r, keys, [object_fields(o) for o in rows[2000:] + stale])
            drain(svc)
            window_state = svc.runtime.dispatcher.window
            watermark = None if window_state is None else (window_state.watermark, window_state.top)
        rejects = Counter(f["_reason"] for _, f in r.xrange(keys.ingest_rejects))
        states[name] = (redis_results(redis_url, ns, queries.column("id").to_pylist()), watermark, feed_lines(r, keys),
                        rejects, ns)
    twin, hostile = states["twin"], states["hostile"]
    assert hostile[0] == twin[0] and hostile[1] == twin[1] and hostile[2] == twin[2]
    assert hostile[3] - twin[3] == Counter({"future": 2, "duplicate_id": 1, "bad_id": 1})
    if window:
        assert twin[1] == (top - lateness, top)
        assert twin[3]["late"] == (1 if lateness else 2)  # stale-near is applied with the lateness
    # Gone from the objects stream: a restart never reads the future entries again.
    assert not [e for e, f in r.xrange(Keys(hostile[4]).ingest_objects) if f.get("id", "").startswith("evil")]
    assert "future 2" in format_status(read_status(redis_url, hostile[4]))
    applied = pa.Table.from_pylist(rows + stale)
    if window:
        t = applied.column("t").to_numpy()
        applied = applied.filter(pa.array(t > top - lateness - window))
    assert_exact(redis_url, hostile[4], queries, BruteForceKnn(applied))


def test_an_entry_id_from_the_future_is_rejected_and_repaired(redis_url, namespace, timed):
    """``XADD`` with an explicit id far ahead: rejected as ``future`` (it would take that time as
    its ``t``); every entry added after it takes a later id and is rejected too, until
    ``knnmon repair --watermark`` sets the stream's ids back to Redis's clock."""
    objects, queries = timed
    rows = objects.to_pylist()
    r, keys = registered(redis_url, namespace, queries)
    # A query whose id is one of the service's own key names: its keys stay its own.
    r.xadd(keys.ingest_queries, {**register_fields(queries.to_pylist()[1]), "id": "ingest:objects"})
    with serve(redis_url, namespace, window=1500 * SECOND) as svc:
        publish(r, keys, [object_fields(o) for o in rows[:1500]])
        drain(svc)
        r.xadd(keys.ingest_objects, {**object_fields(rows[1500]), "t": ""}, id="99999999999999-0")
        r.xadd(keys.ingest_objects, object_fields(rows[1501]))  # takes id 99999999999999-1
        drain(svc)
        assert svc.counters["future"] == 2 and r.type(keys.ingest_objects) == "stream"
        watermark = svc.runtime.dispatcher.window.watermark
    assert watermark == rows[1499]["t"]
    assert r.hgetall(keys.query("ingest:objects"))["k"]
    cli = knnmon_cli("repair", "--watermark", "--redis", redis_url, "--namespace", namespace)
    assert cli.returncode == 0, cli.stderr
    assert "set back to" in cli.stdout
    with serve(redis_url, namespace, window=1500 * SECOND) as svc:
        publish(r, keys, [object_fields(o) for o in rows[1502:]])
        drain(svc)
        assert svc.counters["future"] == 0
    live = pa.Table.from_pylist(rows[:1500] + rows[1502:])
    t = live.column("t").to_numpy()
    live = live.filter(pa.array(t > t.max() - 1500 * SECOND))
    assert_exact(redis_url, namespace, queries, BruteForceKnn(live))


def test_a_poisoned_watermark_is_refused_at_start_and_repaired(redis_url, namespace, timed, monkeypatch):
    """An earlier version (``--max-future off`` behaves as it did, and its late entries stayed in
    the objects stream) applied ``t = 9e18``: every object expired and the next ones were rejected
    as late. A start with the bound refuses, names the repair; after it, the objects rejected as
    late count again and the results are exact."""
    import knnmon.coordinator.service.ledger as ledger

    def acknowledge_as_before(*args, delete=(), **kwargs):  # (a late entry stayed in its stream)
        late = {eid for eid, _, r in args[5] if r.reason == "late"}
        return acknowledge(*args, delete=[eid for eid in delete if eid not in late], **kwargs)

    acknowledge = ledger.acknowledge
    monkeypatch.setattr(ledger, "acknowledge", acknowledge_as_before)
    objects, queries = timed
    rows = objects.to_pylist()
    r, keys = registered(redis_url, namespace, queries)
    # A forged query hash (a client with write access to Redis): left out at recovery, not loaded.
    r.hset(keys.query("forged"), mapping={"lon": "1", "lat": "2", "keywords": "coffee", "k": str(10**12)})
    r.sadd(keys.queries, "forged")
    window = 1500 * SECOND
    with serve(redis_url, namespace, window=window, limits=Limits(max_future_ms=None)) as svc:
        publish(r, keys, [object_fields(o) for o in rows[:1500]])
        drain(svc)
        publish(r, keys, [{**object_fields(rows[1500]), "id": "poison", "t": FAR}])
        drain(svc)
        publish(r, keys, [object_fields(o) for o in rows[1500:]])
        drain(svc)
        assert svc.counters["late"] == 1500  # the damage the bound prevents
        assert "forged" not in svc.life.queries
    monkeypatch.undo()
    r.hset(keys.serve_checkpoint, "watermark", FAR)  # as the earlier version's checkpoint wrote it
    with pytest.raises(PoisonedWatermarkError, match="knnmon repair --watermark"):
        serve(redis_url, namespace, window=window).start()
    dry = repair_watermark(r, keys, dry_run=True)
    assert len(dry.rejected) == 1 and dry.reconsidered == 1500 and dry.checkpoint_watermark == FAR
    assert r.xlen(keys.ingest_objects) == 3001  # the dry run changed nothing
    done = repair_watermark(r, keys)
    assert len(done.rejected) == 1 and done.reconsidered == 1500
    with serve(redis_url, namespace, window=window) as svc:
        drain(svc)
        assert svc.counters["late"] == 0 and svc.runtime.dispatcher.window.top == rows[-1]["t"]
    assert not r.hexists(keys.serve_checkpoint, "watermark")
    # the history stays: 1,500 late (now applied), the poison rejected by the repair
    assert Counter(f["_reason"] for _, f in r.xrange(keys.ingest_rejects)) == {"late": 1500, "future": 1}
    live = objects.filter(pa.array(objects.column("t").to_numpy() > rows[-1]["t"] - window))
    assert_exact(redis_url, namespace, queries, BruteForceKnn(live))
