"""The coordinator's table of announced refill deadlines (``coordinator/runtime/due_lists.py``):
the latest announcement of a query wins, a withdrawal removes it, and a cutoff takes exactly the
queries due by it, once."""

from __future__ import annotations

import numpy as np

from knnmon.batch import NEVER, DueLists
from knnmon.coordinator.runtime.due_lists import DueTable
from knnmon.query import QueryColumns


def _due(ids: list[str], at: list[int]) -> DueLists:
    n = len(ids)
    return DueLists(QueryColumns(ids, np.zeros(n), np.zeros(n), [["cafe"]] * n, np.full(n, 3)),
                    np.array(at, dtype=np.int64))


def test_a_cutoff_takes_the_queries_due_by_it_once():
    table = DueTable()
    table.absorb(_due(["a", "b", "c"], [100, 200, 300]))
    table.absorb(_due(["b", "c", "d"], [150, NEVER, 400]))  # b moved earlier, c withdrawn, d new
    table.absorb(None)
    far = 10**12  # (a horizon so far that nothing is refilled ahead)
    assert len(table) == 3 and not len(table.take(99, far).ids)
    got = table.take(150, far)
    assert sorted(got.ids) == ["a", "b"] and got.k.tolist() == [3, 3] and got.keywords == [["cafe"]] * 2
    assert not len(table.take(150, far).ids)  # taken: the batch that reached them refills them
    assert list(table.take(10**6, far).ids) == ["d"] and len(table) == 0 and table.refilled_ahead == 0


def test_lists_due_soonest_are_refilled_ahead_within_the_budget_once_per_deadline():
    """The budget refills every list held once over the horizon at the cutoff's pace, earliest
    deadline first; a list announced again at the deadline it was refilled ahead at waits for
    it; one announced with a new deadline may be refilled ahead again."""
    table = DueTable()
    ids = [f"q{i}" for i in range(10)]
    table.absorb(_due(ids, [1000 + 100 * i for i in range(10)]))  # q0 at 1000 .. q9 at 1900
    assert not len(table.take(0, 1000).ids)  # (the first cutoff: no pace yet)
    got = table.take(200, 1000)  # 10 lists x 200 ms / 1000 ms: 2 ahead, the earliest
    assert list(got.ids) == ["q0", "q1"] and len(table) == 8 and table.refilled_ahead == 2
    table.absorb(_due(["q0", "q1"], [1000, 5000]))  # q0: nothing newer near it; q1 moved on
    got = table.take(300, 1000)  # 10 x 100 / 1000: 1 ahead, not q0 at the deadline it had
    assert list(got.ids) == ["q2"]
    got = table.take(1000, 1000)  # q0 due now; 8 x 700 / 1000: 5 ahead (q3 .. q7)
    assert list(got.ids) == ["q0", "q3", "q4", "q5", "q6", "q7"]
    table.absorb(_due(["q3"], [2500]))  # refilled ahead, a new deadline: ahead again when its turn comes
    assert list(table.take(1100, 1000).ids) == []  # 4 x 100 / 1000: none
    assert list(table.take(1600, 1000).ids) == ["q8", "q9"]  # 4 x 500 / 1000: 2, the earliest
