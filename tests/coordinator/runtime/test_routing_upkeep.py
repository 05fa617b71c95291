"""The routing table's periodic rebuild backs off while it shrinks nothing (routing_upkeep.next_period); a
SIGKILLed service's spawned helpers (the build process, a recovery's read) end by themselves."""

import os
import signal
import subprocess
import sys
import time

import pytest

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


_BUILD = """
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
from knnmon.coordinator.runtime.routing_upkeep import _child_start
if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_start,
                               initargs=(None,))
    print(pool.submit(os.getpid).result(), flush=True)
    sys.stdin.read()
"""

# A recovery's read of the objects, busy when the service dies: its Redis (a socket that never
# answers) keeps it waiting 30 s, longer than the test waits for its end.
_READ = """
import multiprocessing, socket, sys
from knnmon.coordinator.recovery.object_log import read_elsewhere
from knnmon.limits import DEFAULT_LIMITS
if __name__ == "__main__":
    mute = socket.create_server(("127.0.0.1", 0))
    read_elsewhere(f"redis://127.0.0.1:{mute.getsockname()[1]}", "x", None, DEFAULT_LIMITS, frozenset(), None, 0)
    while not multiprocessing.active_children():
        pass
    print(multiprocessing.active_children()[0].pid, flush=True)
    sys.stdin.read()
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # (a zombie no one reaps has ended)
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("helper", [_BUILD, _READ], ids=["routing build", "recovery read"])
def test_a_helper_process_ends_with_the_service_that_started_it(helper):
    """A SIGKILLed service's spawned helper (the routing table's build process, a recovery's
    read of the objects; its pool's both queue ends live there) ends by itself within 20 s."""
    service = subprocess.Popen([sys.executable, "-c", helper], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    build = int(service.stdout.readline())
    try:
        assert _running(build)
        service.kill()
        service.wait()
        until = time.monotonic() + 20
        while _running(build) and time.monotonic() < until:  # (waits for the process's end itself)
            time.sleep(0.1)
        assert not _running(build)
    finally:
        if _running(build):
            os.kill(build, signal.SIGKILL)
