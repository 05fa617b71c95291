"""A worker's memory follows its queries: top-k places sum to the queries' k, unregistered
queries and objects that left every result are released, and results stay exact meanwhile."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import knnmon.workers.state as worker_state
from knnmon.oracle import BruteForceKnn
from knnmon.query import QueryColumns
from knnmon.workers.worker import KnnWorker

WORDS = ["cafe", "bar", "park"]


def _objects(rng: np.random.Generator, n: int, start: int) -> pa.Table:
    ids = [f"o{start + i:06d}" for i in range(n)]
    kws = [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(n)]
    return pa.table({"id": ids, "lon": rng.integers(-30, 31, n) * 0.001, "lat": rng.integers(-30, 31, n) * 0.001,
                     "t": np.arange(start, start + n, dtype=np.int64), "keywords": kws})


def _queries(rng: np.random.Generator, names: list[str], k_max: int) -> QueryColumns:
    n = len(names)
    return QueryColumns(names, rng.integers(-30, 31, n) * 0.001, rng.integers(-30, 31, n) * 0.001,
                        [sorted(set(rng.choice(WORDS, size=rng.integers(1, 3)).tolist())) for _ in range(n)],
                        rng.integers(1, k_max + 1, n))


def test_top_k_memory_is_the_sum_of_k_not_the_largest_k_times_the_queries():
    w = KnnWorker(0)
    rng = np.random.default_rng(1)
    many = _queries(rng, [f"q{i}" for i in range(1000)], 1)
    w.load_queries(QueryColumns(many.ids, many.lon, many.lat, many.keywords, [1] * 1000), [[]] * 1000, {})
    w.register_queries(QueryColumns(["wide"], [0.0], [0.01], [["cafe"]], [1000]), [[]], {})
    assert len(w.state.lists.d) == len(w.state.lists.h) == 1000 + 1000  # a padded layout would hold 1001 x 1000


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       steps=st.lists(st.sampled_from(["batch", "register", "unregister", "handover"]), min_size=3, max_size=14))
def test_released_and_compacted_state_stays_exact(seed, steps):
    rng = np.random.default_rng(seed)
    original = worker_state.COMPACT_MIN
    worker_state.COMPACT_MIN = 8  # compact often
    try:
        w = KnnWorker(0)
        seen = _objects(rng, 30, 0)
        live: dict[str, tuple] = {}
        oracle = BruteForceKnn(seen)

        def register(names: list[str]) -> None:
            q = _queries(rng, names, 6)
            topk = [oracle.knn(q.lon[i], q.lat[i], q.keywords[i], int(q.k[i])) for i in range(len(names))]
            w.register_queries(q, topk, {})
            for i, name in enumerate(names):
                live[name] = (q.lon[i], q.lat[i], q.keywords[i], int(q.k[i]))

        register([f"q{i}" for i in range(12)])
        made, start = 12, 30
        for b, step in enumerate(steps):
            if step == "batch":
                batch = _objects(rng, 20, start)
                start += 20
                w.process_batch(b, batch.column("id").to_pylist(), batch.column("lon").to_numpy(),
                                batch.column("lat").to_numpy(), batch.column("t").to_numpy(),
                                batch.column("keywords").to_pylist())
                seen = pa.concat_tables([seen, batch])
                oracle = BruteForceKnn(seen)
            elif step == "register":
                register([f"q{made}", f"q{made + 1}"])
                made += 2
            elif step == "handover":  # half the queries to another worker and back (new slots here)
                names = list(live)[::2]
                other = KnnWorker(1)
                other.adopt_queries(w.export_queries(names))
                w.release_handed()
                w.adopt_queries(other.export_queries(names))
            elif live:
                for name in list(live)[: max(1, len(live) // 2)]:
                    assert w.unregister_query(name)
                    del live[name]
            for name, (lon, lat, kws, k) in live.items():
                want = oracle.knn(lon, lat, kws, k)
                assert [o for o, _ in w.result(name)] == [o for o, _ in want], (b, step, name)
            # What is held follows the live queries (compaction releases the rest).
            assert len(w.state.lists.d) <= 2 * sum(k for *_, k in live.values()) + 8 * 6
            assert len(w.state.queries) <= 2 * len(live) + 8 and sorted(w.state.queries.live_ids()) == sorted(live)
            held = set(w.state.handles.names(w.state.lists.h[w.state.lists.h >= 0].tolist()))
            assert len(w.state.handles) <= max(8, worker_state.HANDLES_SLACK * w.state.handles.live)
            assert held <= set(w.state.handles.ids.tolist())
        # The state equals a worker rebuilt from the exact results: same queries, same kNN radii.
        names = sorted(live)
        rebuilt = KnnWorker(2)
        cols = QueryColumns(names, [live[n][0] for n in names], [live[n][1] for n in names],
                            [live[n][2] for n in names], [live[n][3] for n in names])
        rebuilt.load_queries(cols, [oracle.knn(*live[n]) for n in names], {})
        radii = {name: dict(zip(q.column("id").to_pylist(), r.tolist())) for name, (q, r) in (("w", w.regions()),
                                                                         ("rebuilt", rebuilt.regions()))}
        assert sorted(radii["w"]) == names and radii["w"] == radii["rebuilt"]
    finally:
        worker_state.COMPACT_MIN = original


def test_handles_of_objects_that_left_every_result_are_released(monkeypatch):
    monkeypatch.setattr(worker_state, "COMPACT_MIN", 8)
    w = KnnWorker(0)
    w.load_queries(QueryColumns(["q"], [0.0], [0.0], [["cafe"]], [1]), [[]], {})
    for b in range(200):  # each object is nearer than the last: it replaces the result
        d = 1.0 / (b + 1)
        w.process_batch(b, [f"o{b}"], np.array([d]), np.array([0.0]), np.array([b]), [["cafe"]])
        assert [o for o, _ in w.result("q")] == [f"o{b}"]
        assert len(w.state.handles) <= 8 + 1


def test_a_keyword_without_a_coordinator_code_gets_a_code_no_given_keyword_has():
    # A worker knows only its own queries' codes (sparse in the routing table's numbering):
    # a keyword that came without one must not take a code the coordinator gave another.
    w = KnnWorker(0)
    w.load_queries(QueryColumns(["a"], [0.0], [0.0], [["cafe"]], [1]), [[]], {}, vocabulary={"cafe": 7, "bar": 3})
    w.register_queries(QueryColumns(["b"], [0.0], [0.0], [["park", "bar"]], [1]), [[]], {})
    assert w.state.vocabulary.codes == {"cafe": 7, "bar": 3, "park": 8}
    objects = _objects(np.random.default_rng(0), 40, 0)
    w.process_batch(1, objects.column("id").to_pylist(), objects.column("lon").to_numpy(),
                    objects.column("lat").to_numpy(), objects.column("t").to_numpy(),
                    objects.column("keywords").to_pylist())
    oracle = BruteForceKnn(objects)
    assert w.result("b") == oracle.knn(0.0, 0.0, ["park", "bar"], 1)
    assert w.result("a") == oracle.knn(0.0, 0.0, ["cafe"], 1)
