"""A process's own memory: how much it holds, and handing freed heap back to the operating
system."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

__all__ = ["bulk_build", "full_gc_passes", "give_back", "resident_bytes"]


class _FullPasses:
    """The cyclic collector's full passes (generation 2) in this process since the first call
    of :func:`full_gc_passes`: how many, their total and longest wall time, ms."""

    def __init__(self) -> None:
        self.count, self.total_ms, self.max_ms = 0, 0.0, 0.0
        self._start: float | None = None
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            ms = (time.perf_counter() - self._start) * 1000
            self.count, self.total_ms, self.max_ms = self.count + 1, self.total_ms + ms, max(self.max_ms, ms)
            self._start = None

    def state(self) -> dict[str, float]:
        """``{"count", "total_ms", "max_ms"}``."""
        return {"count": self.count, "total_ms": round(self.total_ms, 1), "max_ms": round(self.max_ms, 1)}


_passes: _FullPasses | None = None


def full_gc_passes() -> _FullPasses:
    """This process's record of the collector's full passes (started on the first call): a full
    pass walks every tracked object, and stalls whatever the process does meanwhile (a batch)."""
    global _passes
    if _passes is None:
        _passes = _FullPasses()
    return _passes


@contextlib.contextmanager
def bulk_build() -> Iterator[None]:
    """Build a large long-lived state (a recovery, a worker's load) without Python's cyclic
    garbage collector, then keep it out of every later collection.

    CPython's collector runs a full pass over every tracked object each time the objects
    created since the last one reach a quarter of those that survived it; building millions of
    objects (parsed stream entries, query ids) thus costs several passes over the whole heap,
    more than the building itself. Inside the block the collector is off; on leaving it (also on
    an error) one full collection frees any cycles made, and what survives is frozen
    (``gc.freeze``): kept out of later passes, so the batches that follow do not pay for
    walking it again. Objects frozen stay freed by reference counting; a cycle among them is
    only freed once unfrozen (:func:`gc.unfreeze`, which the next ``bulk_build`` does first, so a
    second recovery in one process collects the first one's leftovers). Nested blocks leave the
    collector to the outermost.
    """
    if not gc.isenabled():  # an outer block (or the embedding program) owns the collector
        yield
        return
    gc.unfreeze()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def give_back() -> None:
    """Return the process's freed heap memory to the operating system (glibc's
    ``malloc_trim(0)``). After a large transient step (the plan, a dropped search tree, a
    worker's initial load) glibc keeps the freed pages in the resident set otherwise: at 1 M
    queries the coordinator held 1.4 GB more after planning without it. Does
    nothing where the C library is not glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        pass


def resident_bytes(field: str = "VmRSS") -> int | None:
    """This process's resident memory now (bytes), one field of ``/proc/self/status``:
    ``VmRSS`` (everything resident) or ``RssAnon`` (its own heap and stacks: without mapped
    files and shared memory, such as the pages of Ray's object store that an actor read its
    arguments from). ``None`` where there is no ``/proc`` or no such field."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None
