"""Event time in ``knnmon run``: a stream from the future is refused unless ``--max-future off``;
allowed lateness admits what the oracle admits; a hostile query cannot flood the routing table.
Real places, real Redis, results checked against the brute-force oracle."""

from __future__ import annotations

import shutil
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from knnmon.coordinator.live_routing import MAX_ENTRIES_PER_QUERY
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.runtime import Runtime
from knnmon.coordinator.runtime.preparation import with_arrival_times
from knnmon.errors import InvalidArgumentError
from knnmon.ingest.reading import load_queries, read_objects, stream_order
from knnmon.limits import Limits
from knnmon.oracle import BruteForceKnn
from knnmon.query import Query
from knnmon.store import StoreConfig
from tests.support import assert_exact

SECOND = 1000
FAR = 9_000_000_000_000_000_000


@pytest.fixture(scope="module")
def future_dir(places_slice, tmp_path_factory):
    """A copy of the slice's ingest output where one place has ``t = 9e18``; its id."""
    out = tmp_path_factory.mktemp("future") / "objects"
    shutil.copytree(places_slice, out)
    files = sorted(out.glob("objects.parquet/*.parquet")) or [out / "objects.parquet"]
    table = pa.concat_tables([pq.read_table(f) for f in files])
    t = table.column("t").to_numpy().copy()
    t[0] = FAR
    poisoned = table.column("id")[0].as_py()
    for f in files:
        f.unlink()
    pq.write_table(table.set_column(table.column_names.index("t"), "t", pa.array(t)), files[0])
    return out, poisoned


@pytest.mark.parametrize("window", [None, 1500 * SECOND])
def test_run_refuses_a_stream_from_the_future_naming_the_object(future_dir, slice_queries, window, redis_url,
                                                                 namespace, tmp_path):
    objects_dir, poisoned = future_dir
    queries = load_queries(str(slice_queries)).slice(0, 200)
    config = RunConfig(workers=2, initial=3000, batch=500, executor="inline", window=window,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with pytest.raises(InvalidArgumentError, match=f"object {poisoned!r} has t={FAR}.*--max-future off"):
        Runtime(str(objects_dir), queries, config).start()


def test_run_with_max_future_off_keeps_the_object(future_dir, slice_queries, redis_url, namespace, tmp_path):
    """Append-only, ``--max-future off``: the far-future object is an object like any other."""
    objects_dir, poisoned = future_dir
    queries = load_queries(str(slice_queries)).slice(0, 300)
    config = RunConfig(workers=2, initial=9000, batch=500, executor="inline", limits=Limits(max_future_ms=None),
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(str(objects_dir), queries, config) as rt:
        rt.run(progress=False)
    everything = stream_order(read_objects(str(objects_dir)), None)
    assert poisoned in everything.column("id").to_pylist()
    assert_exact(redis_url, namespace, queries, BruteForceKnn(everything))


@pytest.mark.parametrize("lateness_s", [0, 400])
def test_allowed_lateness_applies_what_the_oracle_admits(places_slice, slice_queries, lateness_s, redis_url,
                                                         namespace, tmp_path):
    """One object a second; a window of 1,000 s. A batch of 200 fresh objects carries 50 that are
    up to 400 s behind the window's cutoff (live with 400 s of allowed lateness, late without)
    and 50 that are further behind (late either way)."""
    objects = with_arrival_times(stream_order(read_objects(str(places_slice)), None), SECOND)
    queries = load_queries(str(slice_queries)).slice(0, 1500)
    window, lateness = 1000 * SECOND, lateness_s * SECOND
    config = RunConfig(workers=2, initial=3000, batch=250, batches=1, executor="inline", window=window,
                       allowed_lateness=lateness, arrival_ms=SECOND,
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    with Runtime(str(places_slice), queries, config) as rt:
        fresh = objects.slice(3000, 200)
        top = int(fresh.column("t").to_numpy().max())
        cutoff0 = top - window  # the cutoff without lateness
        t_all = objects.column("t").to_numpy()
        near = objects.filter(pa.array((t_all > cutoff0 - 400 * SECOND) & (t_all <= cutoff0))).slice(0, 50)
        far = objects.filter(pa.array(t_all <= cutoff0 - 400 * SECOND)).slice(0, 50)
        renamed = [b.set_column(0, "id", pa.array([f"again-{i}-{x}" for x in b.column("id").to_pylist()]))
                   for i, b in enumerate((near, far))]
        report = rt.process(pa.concat_tables([fresh, *renamed]))
        # The oracle: what is live at the watermark (the largest t minus the lateness) is applied.
        cutoff = top - lateness - window
        seen = pa.concat_tables([objects.slice(0, 3000), fresh, *renamed])
        expected_late = int((pa.concat_tables(renamed).column("t").to_numpy() <= cutoff).sum())
        assert report.late == expected_late == (50 if lateness_s else 100)
        assert rt.dispatcher.window.watermark == top - lateness
        live = seen.filter(pa.array(seen.column("t").to_numpy() > cutoff))
        assert_exact(redis_url, namespace, queries, BruteForceKnn(live))


def test_a_hostile_query_cannot_flood_the_routing_table(places_slice, slice_queries, redis_url, namespace, tmp_path):
    """A query registered with ``limits.max_keywords`` of the most common keywords and the largest k
    adds at most MAX_ENTRIES_PER_QUERY routing entries; every result stays exact."""
    objects = stream_order(read_objects(str(places_slice)), None)
    queries = load_queries(str(slice_queries)).slice(0, 300)
    config = RunConfig(workers=2, initial=4000, batch=500, batches=4, executor="inline",
                       store=StoreConfig(redis_url, namespace, str(tmp_path)))
    counts = Counter(w for kw in objects.column("keywords").to_pylist() for w in kw)
    common = [w for w, _ in counts.most_common(32)]
    with Runtime(str(places_slice), queries, config) as rt:
        before = rt.plan.routing.entries
        at = objects.slice(100, 1).to_pylist()[0]
        hostile = Query.create("hostile", at["lon"], at["lat"], common, config.limits.max_k, limits=config.limits)
        assert len(hostile.keywords) == 32
        rt.registrar.register([hostile])
        assert rt.plan.routing.entries - before <= MAX_ENTRIES_PER_QUERY
        routing = rt.plan.routing  # routed by its keywords everywhere: exact, and constant in size
        assert all(routing.table.always[routing.code(w)] != 0 for w in hostile.keywords)
        for batch in rt.batches():
            rt.process(batch)
    everything = BruteForceKnn(objects.slice(0, 6000))
    assert_exact(redis_url, namespace, pa.concat_tables([queries, pa.table(
        {"id": ["hostile"], "lon": [hostile.lon], "lat": [hostile.lat], "keywords": [list(hostile.keywords)],
         "k": [hostile.k]}).cast(queries.schema)]), everything)
