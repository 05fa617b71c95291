"""SIGTERM before a command installs handlers of its own; a helper process's end with its parent.

A command's SIGTERM unwinds it as Ctrl-C does (:func:`on_sigterm` raises ``SystemExit``). Python
runs the handler between bytecodes wherever the main thread is: inside a finalizer or a weakref
callback the exception is printed ("Exception ignored in ...") and dropped, and the command went
on. ``knnmon serve`` once kept serving after a SIGTERM that came during its recovery this way.
So the handler also records that termination was asked (:func:`asked`), and a command that takes
SIGTERM over (the service's loop) stops at once when it was.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

__all__ = ["asked", "end_with_parent", "on_sigterm"]

_asked = False


def on_sigterm(signum: int, _frame) -> None:
    """The SIGTERM handler of ``knnmon``: records the request, then raises ``SystemExit(128 + signum)``."""
    global _asked
    _asked = True
    raise SystemExit(128 + signum)


def asked() -> bool:
    """Whether a SIGTERM reached :func:`on_sigterm` in this process (maybe dropped where it was raised)."""
    return _asked


def end_with_parent() -> None:
    """End this process (``os._exit(0)``) once its parent has, from a daemon thread that looks
    once a second: the initializer of a spawned pool's process. A SIGKILLed service's pool
    otherwise leaves its process waiting for work for good, with what it holds (both ends of
    the pool's call queue live in it)."""

    def watch(parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    parent = multiprocessing.parent_process()  # (the pid it was started by: os.getppid() is another's once it died)
    pid = parent.pid if parent is not None else os.getppid()
    threading.Thread(target=watch, args=(pid,), daemon=True, name="knnmon-end-with-parent").start()
