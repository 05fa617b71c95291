"""A SIGTERM whose ``SystemExit`` Python drops where it was raised (a finalizer) is still known to
the command (``knnmon.termination``): ``knnmon serve`` stops at once when it takes SIGTERM over."""

import subprocess
import sys

_DROPPED = """
import signal
from knnmon import termination
class Finalized:
    def __del__(self):
        termination.on_sigterm(signal.SIGTERM, None)
Finalized()
print("went on; asked:", termination.asked())
"""


def test_a_sigterm_dropped_in_a_finalizer_is_still_asked():
    out = subprocess.run([sys.executable, "-c", _DROPPED], capture_output=True, text=True, timeout=120)
    assert "SystemExit: 143" in out.stderr  # (Python printed it as ignored, and went on)
    assert "went on; asked: True" in out.stdout
