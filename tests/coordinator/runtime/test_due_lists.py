"""The coordinator's table of announced refill deadlines (``coordinator/runtime/due_lists.py``):
the latest announcement of a query wins, a withdrawal removes it, and a cutoff takes exactly the
queries due by it, once."""

from __future__ import annotations

import numpy as np

from knnmon.coordinator.runtime.due_lists import DueTable
from knnmon.query import QueryColumns
from knnmon.refills import NEVER, DueLists


def _due(ids: list[str], at: list[int]) -> DueLists:
    n = len(ids)
    return DueLists(QueryColumns(ids, np.zeros(n), np.zeros(n), [["cafe"]] * n, np.full(n, 3)),
                    np.array(at, dtype=np.int64))


def test_a_cutoff_takes_the_queries_due_by_it_once():
    table = DueTable()
    table.absorb(_due(["a", "b", "c"], [100, 200, 300]))
    table.absorb(_due(["b", "c", "d"], [150, NEVER, 400]))  # b moved earlier, c withdrawn, d new
    table.absorb(None)
    assert len(table) == 3 and not len(table.take(99).ids)
    got = table.take(150)
    assert sorted(got.ids) == ["a", "b"] and got.k.tolist() == [3, 3] and got.keywords == [["cafe"]] * 2
    assert not len(table.take(150).ids)  # taken: the batch that reached them refills them
    assert list(table.take(10**6).ids) == ["d"] and len(table) == 0
    table.absorb(_due(["e", "f"], [120, 130]))
    table.absorb(_due(["e"], [500]))  # moved later: not due at its first deadline
    assert list(table.take(150).ids) == ["f"] and list(table.take(500).ids) == ["e"] and len(table) == 0


def test_replaced_announcements_do_not_pile_up():
    """A list announced again and again keeps one entry due, and the table's memory stays
    proportional to the lists held."""
    table = DueTable()
    for at in range(5000):
        table.absorb(_due(["a", "b"], [10_000 + at, 20_000 - at]))
    assert len(table) == 2 and len(table._heap) <= 2 * 2 + 1024 + 2
    assert list(table.take(10**6).ids) == ["a", "b"]  # (14,999 and 15,001: earliest first)
