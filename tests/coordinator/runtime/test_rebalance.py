"""Re-balancing under drift: a stream built to drift (the west's places first, the east's after)
makes one worker hot; queries move between live workers and every result stays exact against
the brute-force oracle after every batch, on real places, real Redis (and Ray)."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from knnmon.assignment import LoadModel
from knnmon.connection import connect
from knnmon.coordinator.rebalance.rebalancer import Rebalancer
from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig
from knnmon.coordinator.rebalance.monitor import SmoothedMonitor
from knnmon.coordinator.rebalance.planner import plan_moves
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.runtime.preparation import prepare_tables
from knnmon.errors import InvalidArgumentError
from knnmon.ingest.reading import load_queries, read_objects
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.store import StoreConfig
from tests.support import assert_exact, assert_feed_and_objects

#: Eager settings for a short stream: judge every 3 batches, move up to 15 % of the queries.
EAGER = RebalanceConfig(window=3, threshold=1.05, budget=0.15, min_gain=0.01, min_total_gain=0.0, cooldown=1,
                        trigger="window")


@pytest.fixture(scope="module")
def drifting(places_slice, slice_queries):
    """The slice's places: 2,000 random ones initial, every other one of the rest streamed west
    to east (a drift: the stream's objects fall in one region first, another after), and 1,500
    queries."""
    objects = read_objects(str(places_slice))
    rng = np.random.default_rng(3)
    order = rng.permutation(objects.num_rows)
    initial = objects.take(pa.array(order[:2000]))
    rest = objects.take(pa.array(order[2000:]))
    west_to_east = np.argsort(rest.column("lon").to_numpy(), kind="stable")
    rest = rest.take(pa.array(west_to_east[::2]))  # 4,000
    queries = load_queries(str(slice_queries)).slice(0, 1500)
    return str(places_slice), queries, initial, rest


def _prepared(drifting, reserve: int = 0):
    objects_dir, queries, initial, rest = drifting
    return prepare_tables(LoadModel.from_ingest(objects_dir), queries, initial, rest, reserve=reserve)


def _moved_fields_agree(url: str, namespace: str, rt: Runtime) -> int:
    """Assert each moved query's hash names its worker now, and says where it came from;
    returns how many queries moved."""
    r, keys = connect(url), Keys(namespace)
    moved = 0
    try:
        for qid, w in rt.registrar.query_worker.items():
            h = r.hgetall(keys.query(qid))
            assert int(h["worker"]) == w, qid
            assert h["objects"] == keys.objects(w), qid
            if "moved_from" in h:
                moved += 1
                assert int(h["moved_from"]) != w or int(h["moved_replan"]) >= 2, qid
        records = [json.loads(x) for x in r.lrange(keys.replans, 0, -1)]
        assert [x["replan"] for x in records] == list(range(len(records), 0, -1))  # newest first
        assert sum(x["queries_moved"] for x in records) == rt.rebalancer.queries_moved
    finally:
        r.close()
    return moved


@pytest.mark.parametrize("reserve, trigger", [pytest.param(0, "window", marks=pytest.mark.slow),
                                              pytest.param(2, "window", marks=pytest.mark.slow), (0, "smoothed")])
# (all but the default trigger: -m slow, 8 s each)
def test_drift_moves_queries_exact_after_every_batch(drifting, redis_url, namespace, tmp_path, reserve, trigger):
    """Inline workers, one batch at a time: the oracle agrees after every batch while queries
    move (with and without a reserve, by each trigger); the moved queries' Redis fields, the
    feed and the details hashes agree with where they are; each re-plan is judged by its
    realised gain."""
    objects_dir, queries, initial, rest = drifting
    rebalance = EAGER if trigger == "window" else replace(EAGER, trigger=trigger, half_life=2.0)
    config = RunConfig(workers=3, algorithm="space", batch=250, executor="inline", reserve=reserve,
                       rebalance=rebalance, store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(None, None, config, prepared=_prepared(drifting, reserve), rebalancer=Rebalancer) as rt:
        seen = initial
        for batch in rt.batches():
            rt.process(batch)
            seen = pa.concat_tables([seen, batch.select(seen.column_names)])
            assert_exact(redis_url, namespace, queries, BruteForceKnn(seen))
        replans = rt.rebalancer.replans
        moved = _moved_fields_agree(redis_url, namespace, rt)
        r = connect(redis_url)
        assert_feed_and_objects(r, Keys(namespace), list(rt.registrar.query_worker))
        r.close()
        assert sum(rt.registrar.worker_queries) == len(queries)
        assert sorted(sum((rt.pool.gather([rt.pool.query_loads(w) for w in range(3)])[w][0] for w in range(3)), [])) == \
            sorted(queries.column("id").to_pylist())  # every query on exactly one worker
    assert replans and rt.rebalancer.queries_moved > 0
    assert moved > 0
    assert all(x.queries_moved <= int(EAGER.budget * len(queries)) for x in replans)
    # every re-plan that moved is judged (its realised gain) at the next re-plan or 10 batches
    # later: all but the last surely, the first here too (16 batches, the first move by batch 3)
    moving = [x for x in replans if x.queries_moved]
    judged = [x for x in moving if x.realized_gain is not None]
    assert moving[0].batch > 4 or moving[0] in judged
    assert all(x in judged for x in moving[:-1])
    assert all(isinstance(x.realized_gain, float) and x.realized_after_batches >= 1 for x in judged)
    r = connect(redis_url)
    stored = {x["replan"]: x for x in map(json.loads, r.lrange(Keys(namespace).replans, 0, -1))}
    r.close()
    assert all(stored[x.replan].get("realized_gain") == x.realized_gain for x in judged)


def test_moves_in_flight_on_ray_exact_after_every_batch(drifting, ray_instance, redis_url, namespace, tmp_path):
    """Ray actors; the loads are gathered and the plan made while batches go on, and a move is
    sent without waiting for the hand-over (as ``knnmon run`` does: handover_flight), so the
    next batch is routed while the exports and adoptions are queued: it is forwarded to the
    targets. The oracle agrees after every batch, before and after each landing; every moved
    query lands (its target's entries route it), the forwarding ends, the sources' release
    narrows the routing table at a later boundary. (``knnmon run`` with two batches in flight
    and re-plans takes this path too: tests/coordinator/cli/test_run.py.)"""
    objects_dir, queries, initial, rest = drifting
    config = RunConfig(workers=3, algorithm="space", batch=250, executor="ray", rebalance=EAGER,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    forwarded = 0
    with Runtime(None, None, config, prepared=_prepared(drifting), rebalancer=Rebalancer) as rt:
        routing, seen = rt.registrar.plan.routing, initial
        for batch in rt.batches():
            forwarded += bool(routing.forwards)
            report = rt.reviver.collect(rt.dispatcher.dispatch(batch), deque())
            seen = pa.concat_tables([seen, batch.select(seen.column_names)])
            assert_exact(redis_url, namespace, queries, BruteForceKnn(seen))
            rt.rebalance(report, idle=False, wait_moves=False)
        rt.pool.gather([rt.pool.stats(w) for w in range(3)])  # the last hand-over done
        rt.rebalance(report, idle=False, wait_moves=False)
        moving = [x for x in rt.rebalancer.replans if x.queries_moved]
        assert moving and forwarded >= 1 and not routing.forwards
        assert all(x.land_seconds is not None and x.move_phases_ms["adopt"] > 0 for x in moving)
        # the sources' release answered at a later boundary: the routing table narrowed then
        assert all(x.entries_narrowed is not None for x in moving[:-1]) and any(x.entries_narrowed for x in moving)
        assert all(x.batch > x.asked_after_batch for x in rt.rebalancer.replans)  # planned while batches went on
        assert rt.rebalancer.queries_moved == sum(x.queries_moved for x in rt.rebalancer.replans)
        assert_exact(redis_url, namespace, queries, BruteForceKnn(seen))
        _moved_fields_agree(redis_url, namespace, rt)
        assert sum(rt.registrar.worker_queries) == len(queries)


def test_the_planner_spreads_the_hottest_set_within_the_budget():
    """Worker 0 is hot with two sets: the planner spreads the hottest set's queries onto the idle
    worker until the two are even, never more queries than the budget, and predicts a lower
    maximum; two even workers move nothing."""
    ids0 = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    loads0 = np.r_[np.full(10, 3.0), np.full(10, 1.0)]
    set_of = {q: (0 if q[0] == "a" else 1) for q in ids0} | {"c0": 2}
    tight = plan_moves([41.25, 1.25], [(ids0, loads0), (["c0"], np.zeros(1))], set_of, budget=3)
    assert tight.queries_moved == 3 and tight.moves[0].unit == "set 0 (spread)"  # the hottest set's heaviest
    even = plan_moves([10.0, 10.0], [(ids0, loads0), (["c0"], np.ones(1))], set_of, budget=10)
    assert not even.moves
    spread = plan_moves([41.25, 1.25], [(ids0, loads0), (["c0"], np.zeros(1))], set_of, budget=10)
    assert [m.unit for m in spread.moves] == ["set 0 (spread)"] and spread.queries_moved == 7  # until even
    assert spread.moves[0].qids == [f"a{i}" for i in range(7)] and spread.predicted_ms.max() == 22.25
    assert all(m.source == 0 and m.target == 1 for m in spread.moves)


def test_rebalance_settings_are_checked():
    with pytest.raises(InvalidArgumentError, match="budget"):
        RebalanceConfig(budget=1.5)
    with pytest.raises(InvalidArgumentError, match="threshold"):
        RebalanceConfig(threshold=0.5)
    with pytest.raises(InvalidArgumentError, match="threshold"):
        RebalanceConfig(threshold=float("nan"))
    with pytest.raises(InvalidArgumentError, match="trigger"):
        RebalanceConfig(trigger="sometimes")
    with pytest.raises(InvalidArgumentError, match="half-life"):
        RebalanceConfig(trigger="smoothed", half_life=float("nan"))
    with pytest.raises(InvalidArgumentError, match="half-life"):
        RebalanceConfig(trigger="smoothed", half_life=float("inf"))  # (its trigger's batches: round(inf))


def test_the_smoothed_trigger_follows_a_drift_within_a_few_batches_and_not_one_noisy_batch():
    """Four workers with noisy, even busy times: never due. One batch of a worker at 3x: not
    due (within the noise the smoothing has seen). Worker 0 at 2x from then on: due within a
    few batches, far sooner than a 20-batch window would be. After a reset to the move's
    predicted times, not due for ``least`` batches."""
    rng = np.random.default_rng(0)
    m = SmoothedMonitor(4, half_life=4.0, threshold=1.2)

    def even():
        return 10.0 + rng.normal(0.0, 1.5, 4)

    for _ in range(30):
        m.observe(even())
        assert not m.due()
    m.observe(even() * np.array([3.0, 1, 1, 1]))
    assert not m.due()
    for _ in range(4):
        m.observe(even())
    assert not m.due()
    for after in range(1, 21):
        m.observe(even() * np.array([2.0, 1, 1, 1]))
        if m.due():
            break
    assert after <= 6 and m.ratio() > 1.2
    m.reset([13.0, 13.0, 12.0, 12.0])
    assert m.ratio() < 1.1
    for _ in range(m.least - 1):
        m.observe(even())
        assert not m.due()


def test_routing_follows_registration_radius_and_moves(drifting, redis_url, namespace, tmp_path):
    """A query registered before any object matches it is routed everywhere; once it has k,
    the next rebuild routes its keyword near it only. Moved to another worker, its keyword
    reaches only the new worker at once (the source withdrawn from its entries), and after a
    rebuild still."""
    from knnmon.coordinator.rebalance.migration import migrate
    from knnmon.coordinator.rebalance.planner import Move
    from knnmon.query import Query

    objects_dir, queries, initial, rest = drifting
    config = RunConfig(workers=3, algorithm="space", batch=250, executor="inline",
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(None, None, config, prepared=_prepared(drifting), rebalancer=Rebalancer) as rt:
        routing = rt.dispatcher.routing
        at = initial.slice(0, 1).to_pylist()[0]
        far = (at["lon"] + 3.0, at["lat"] - 2.0)

        def route(lon: float, lat: float) -> int:
            kw = pa.array([["zzqlate"]], pa.list_(pa.string()))
            return int(routing.route_objects(np.array([lon]), np.array([lat]), kw)[0])

        [w] = rt.registrar.register([Query.create("late", at["lon"], at["lat"], ["zzqlate"], 2)])
        assert route(*far) == route(at["lon"], at["lat"]) == 1 << w  # no match yet: everywhere
        near = pa.table({"id": ["n1", "n2"], "lon": [at["lon"] + 1e-3, at["lon"] - 1e-3], "lat": [at["lat"]] * 2,
                         "t": [initial.column("t").to_numpy().max() + 1] * 2,
                         "keywords": pa.array([["zzqlate"], ["zzqlate"]], pa.list_(pa.string()))})
        rt.process(near)
        rt.upkeep.rebuild()
        assert route(*far) == 0 and route(at["lon"], at["lat"]) == 1 << w  # k results: near it only
        target = (w + 1) % 3
        done = migrate(rt.pool, rt.registrar, [Move(["late"], w, target, 0.0, "test")])
        assert route(at["lon"], at["lat"]) == 1 << target and route(*far) == 0  # the source withdrawn at once
        assert done.entries_narrowed >= 1
        rt.upkeep.rebuild()
        assert route(at["lon"], at["lat"]) == 1 << target and route(*far) == 0
        assert sorted(o for o, _ in rt.registrar.result("late")) == ["n1", "n2"]  # the target holds its kNN
        r = connect(redis_url)
        assert int(r.hget(Keys(namespace).query("late"), "worker")) == target
        assert {o for o in r.zrange(Keys(namespace).result("late"), 0, -1)} == {"n1", "n2"}
        r.close()


def test_the_planner_keeps_recently_moved_queries_and_small_gains_still():
    """Frozen queries (moved by a recent re-plan) stay; a re-plan predicted to gain less than
    ``min_total_gain`` moves nothing."""
    ids0 = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    loads0 = np.r_[np.full(10, 3.0), np.full(10, 1.0)]
    set_of = {q: (0 if q[0] == "a" else 1) for q in ids0}
    plan = plan_moves([41.25, 1.25], [(ids0, loads0), ([], np.zeros(0))], set_of, budget=10,
                      frozen=frozenset(ids0[:10]))
    assert plan.moves and not set(plan.moves[0].qids) & set(ids0[:10])
    small = plan_moves([12.0, 10.0], [(ids0, loads0), ([], np.zeros(0))], set_of, budget=10, min_total_gain=0.2)
    assert not small.moves and small.predicted_gain == 0.0


def test_the_planner_relieves_two_equally_hot_workers():
    """Two workers equally hot, two idle, 100 queries each in one set: the spread alternates
    between the two hot ones until all four are near even (a bound of 4 W steps stopped it after
    16 queries, 8 % gained, below the minimum gain: nothing moved)."""
    hot = [[f"{w}q{i}" for i in range(100)] for w in range(2)]
    set_of = {q: w for w in range(2) for q in hot[w]}
    plan = plan_moves([40.0, 40.0, 1.25, 1.25], [(hot[0], np.ones(100)), (hot[1], np.ones(100)),
                                                 ([], np.zeros(0)), ([], np.zeros(0))],
                      set_of, budget=100, min_total_gain=0.1)
    assert plan.moves and plan.queries_moved <= 100
    assert plan.predicted_ms.max() < 0.6 * 40.0
    assert {m.source for m in plan.moves} == {0, 1} and {m.target for m in plan.moves} <= {2, 3}


def test_the_planner_spreads_a_hot_set_in_compact_runs_of_space():
    """Given the queries' positions, a hot set is spread in space order: each target takes one
    run of it, a compact region (few cells of a grid over the set: the cells whose objects it
    now needs); by load alone (no positions) each target's queries lie all over the region."""
    rng = np.random.default_rng(5)
    n = 400
    lon, lat = rng.uniform(-100, -90, n), rng.uniform(35, 40, n)
    ids = [f"q{i}" for i in range(n)]
    loads = rng.uniform(0.5, 1.5, n)
    set_of = dict.fromkeys(ids, 0)
    empty = ([], np.zeros(0), np.zeros(0), np.zeros(0))
    cell = np.floor((lon + 100) / 10 * 8).clip(0, 7) * 8 + np.floor((lat - 35) / 5 * 8).clip(0, 7)

    def cells_per_target(plan) -> list[int]:
        at = {q: i for i, q in enumerate(ids)}
        return [len(np.unique(cell[[at[q] for q in m.qids]])) for m in plan.moves]

    spatial = plan_moves([100.0, 1.25, 1.25, 1.25], [(ids, loads, lon, lat), empty, empty, empty], set_of, n)
    by_load = plan_moves([100.0, 1.25, 1.25, 1.25], [(ids, loads), empty[:2], empty[:2], empty[:2]], set_of, n)
    assert len({m.target for m in spatial.moves}) == 3 == len(spatial.moves)  # one run per target
    assert spatial.predicted_ms.max() < 0.3 * 100.0 and by_load.predicted_ms.max() < 0.3 * 100.0
    assert min(cells_per_target(by_load)) > 36  # by load: each target over most of the 64 cells
    assert sum(cells_per_target(spatial)) < 0.5 * sum(cells_per_target(by_load))
