"""SIGTERM before a command installs handlers of its own.

A command's SIGTERM unwinds it as Ctrl-C does (:func:`on_sigterm` raises ``SystemExit``). Python
runs the handler between bytecodes wherever the main thread is: inside a finalizer or a weakref
callback the exception is printed ("Exception ignored in ...") and dropped, and the command went
on. ``knnmon serve`` once kept serving after a SIGTERM that came during its recovery this way.
So the handler also records that termination was asked (:func:`asked`), and a command that takes
SIGTERM over (the service's loop) stops at once when it was.
"""

from __future__ import annotations

__all__ = ["asked", "on_sigterm"]

_asked = False


def on_sigterm(signum: int, _frame) -> None:
    """The SIGTERM handler of ``knnmon``: records the request, then raises ``SystemExit(128 + signum)``."""
    global _asked
    _asked = True
    raise SystemExit(128 + signum)


def asked() -> bool:
    """Whether a SIGTERM reached :func:`on_sigterm` in this process (maybe dropped where it was raised)."""
    return _asked
