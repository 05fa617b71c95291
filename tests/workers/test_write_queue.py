"""The worker's background write queue against a real Redis: order, waiting, failure."""

from __future__ import annotations

import pytest

from knnmon.batch import BatchChanges, ObjectInfo
from knnmon.connection import connect
from knnmon.errors import StoreUnavailableError
from knnmon.keys import Keys
from knnmon.reports import WriteFigures
from knnmon.workers.result_writer import ResultWriter
from knnmon.workers.write_queue import WriteQueue

OBJ = {f"o{i}": ObjectInfo(-71.0 - i / 100, 41.0, 1_000 + i, ["coffee"]) for i in range(40)}


def _batch(i: int) -> BatchChanges:
    """Batch i's changes: query q gains o{i} and, from the second batch on, loses o{i - 1}."""
    return BatchChanges.from_diffs([("q", [(f"o{i}", float(i))], [f"o{i - 1}"] if i else [])], OBJ, i + 1)


@pytest.fixture
def queue(redis_url, namespace):
    writer = ResultWriter(redis_url, namespace, 0)
    writer.write_queries(-1, [("q", {"k": 1}, [])], {})
    q = WriteQueue(writer)
    yield q
    q.close()
    writer.close()


def test_batches_land_in_order_and_wait_returns_each_ones_figures(queue, redis_url, namespace):
    keys, c = Keys(namespace), connect(redis_url)
    for i in range(30):
        queue.submit_batch(i, _batch(i))
    # A call queued after them sees every batch applied, in order.
    assert queue.now(lambda: c.xlen(keys.changes)) == 31  # the registration, then 30 batches
    assert [f["version"] for _, f in c.xrange(keys.changes)] == [str(i) for i in range(31)]
    assert c.zrange(keys.result("q"), 0, -1) == ["o29"]
    assert c.hkeys(keys.objects(0)) == ["o29"]  # the details of what a result holds, only
    w = queue.wait(29)
    assert w.redis_server_s > 0 and w.redis_s >= w.redis_server_s
    assert queue.wait(29) == WriteFigures(redis_s=0.0, redis_server_s=0.0, writer_cpu_s=0.0)  # taken already


def test_after_a_failed_write_later_ones_are_refused_and_redis_is_untouched(queue, redis_url, namespace):
    keys, c = Keys(namespace), connect(redis_url)
    queue.submit_batch(0, _batch(0))

    def lost() -> None:
        raise ConnectionError("Redis went away (injected)")

    with pytest.raises(ConnectionError):
        queue.now(lost)
    queue.submit_batch(1, _batch(1))
    assert queue.wait(0).redis_server_s > 0  # written before the failure
    with pytest.raises(StoreUnavailableError, match="earlier Redis write failed"):
        queue.wait(1)
    assert c.zrange(keys.result("q"), 0, -1) == ["o0"] and c.xlen(keys.changes) == 2
