"""The routing table's periodic rebuild backs off while it shrinks nothing (routing_upkeep.next_period)."""

from knnmon.coordinator.runtime.routing_upkeep import MAX_REBUILD_S, REBUILD_S, STALE_KEPT, next_period


def test_a_periodic_build_that_shrinks_nothing_doubles_the_period_up_to_its_bound():
    period, seen = REBUILD_S, []
    for _ in range(6):
        period = next_period(period, True, 9_000_000, 9_100_000)
        seen.append(period)
    assert seen == [min(REBUILD_S * 2 ** i, MAX_REBUILD_S) for i in range(1, 7)]
    assert seen[-1] == MAX_REBUILD_S


def test_a_build_that_shrinks_the_table_or_that_growth_made_due_resets_the_period():
    before = 9_000_000
    assert next_period(MAX_REBUILD_S, True, before, int(STALE_KEPT * before) - 1) == REBUILD_S
    assert next_period(MAX_REBUILD_S, False, before, before) == REBUILD_S
    assert next_period(REBUILD_S, True, before, int(STALE_KEPT * before)) == 2 * REBUILD_S
