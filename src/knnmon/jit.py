"""numba's JIT as knnmon uses it: ``cache=True`` into a writable cache directory, ``nogil``.

``NUMBA_CACHE_DIR`` is set here to ``~/.cache/knnmon/numba`` (or a directory under the system's
temporary one where the home directory is not writable) unless the environment sets it: an
installed package's directory may be read-only, and numba reads the variable on import, so
every module with kernels imports :data:`jit` from here. With ``NUMBA_DISABLE_JIT=1`` the kernels
run as plain Python.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["jit", "kernels_cached"]


def _cache_dir() -> str:
    """``~/.cache/knnmon/numba``, or a directory under the system's temporary one where the
    home directory is not writable."""
    for path in (Path.home() / ".cache" / "knnmon" / "numba",
                 Path(tempfile.gettempdir()) / f"knnmon-numba-{os.getuid() if hasattr(os, 'getuid') else 0}"):
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return str(path)
        except OSError:
            continue
    return str(Path(tempfile.mkdtemp(prefix="knnmon-numba-")))


if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir()

import numba  # noqa: E402  (after NUMBA_CACHE_DIR: numba reads it on import)

#: The decorator of every knnmon kernel.
jit = numba.njit(cache=True, nogil=True)


def kernels_cached() -> bool:
    """Whether numba's cache holds the workers' kernels (``workers/kernels.py``'s index files):
    ``False`` where knnmon has not run yet, so that its first start compiles every kernel (about
    a minute on 2 cores, in the coordinator and in each worker)."""
    return any(Path(os.environ["NUMBA_CACHE_DIR"]).glob("*/kernels.*.nbi"))
