"""Handing freed heap memory back to the operating system."""

from __future__ import annotations

__all__ = ["give_back"]


def give_back() -> None:
    """Return the process's freed heap memory to the operating system (glibc's
    ``malloc_trim(0)``). After a large transient step (the plan, a dropped ``rtree`` tree, a
    worker's initial load) glibc keeps the freed pages in the resident set otherwise: at 1 M
    queries the coordinator held 1.4 GB more after planning without it (docs/scale.md). Does
    nothing where the C library is not glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        pass
