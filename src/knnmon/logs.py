"""How knnmon's commands log (``--log-format text|json`` of ``knnmon serve`` and ``knnmon run``).

- ``text``: ``time logger LEVEL message``, one record a line (tracebacks follow on their own lines).
- ``json``: one JSON object a line (``python-json-logger``), with ``time`` (ISO 8601, UTC), ``level``,
  ``logger``, ``event`` (the message), ``batch`` and ``worker``, and ``exc_info`` with a traceback.

``batch`` and ``worker`` come from a record's ``extra`` if it has them, else from the context:
:data:`BATCH` (the service sets it while it applies a batch) and :data:`WORKER` (set while a
worker is revived); ``null`` outside them.

Every line is redacted last (:func:`redact_text`): a password in a URL or a ``password=``
argument shows as ``***``, wherever it came from (knnmon logs URLs through
:func:`knnmon.connection.redact` already; this also covers messages of libraries and tracebacks).

In ``json``, every line of the process's output is a JSON object: what is printed to
``sys.stdout`` or ``sys.stderr`` (as Ray prints its raylet's error reports) becomes a record of
logger ``stdout`` (INFO) or ``stderr`` (WARNING), one per line, colours removed, and a
library's logger that writes on its own, such as Ray's, is made to pass its records on
(:func:`adopt`).
"""

from __future__ import annotations

import io
import logging
import re
import sys
from contextvars import ContextVar

from knnmon.errors import InvalidArgumentError

__all__ = ["BATCH", "FORMATS", "WORKER", "adopt", "configure_logging", "redact_text"]

#: The batch being applied (its number in the service, from 1), for log records.
BATCH: ContextVar[int | None] = ContextVar("knnmon_batch", default=None)
#: The worker being revived or called, for log records.
WORKER: ContextVar[int | None] = ContextVar("knnmon_worker", default=None)
FORMATS = ("text", "json")

_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s\"']*:)[^@\s\"']+@")
_PASSWORD_ARG = re.compile(r"((?:password|passwd|token)=)[^&\s\"']+", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_format: list[str] = []  # the format configured in this process, if any


def redact_text(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@`` and the value of each
    ``password=`` / ``token=`` argument replaced by ``***``.

    >>> redact_text("connect redis://:s3cret@db:6379/0?password=x failed")
    'connect redis://:***@db:6379/0?password=*** failed'
    """
    return _PASSWORD_ARG.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


class _Context(logging.Filter):
    """Gives every record ``batch`` and ``worker`` (its ``extra``, else the context's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "batch"):
            record.batch = BATCH.get()
        if not hasattr(record, "worker"):
            record.worker = WORKER.get()
        return True


class _LinesToRecords(io.TextIOBase):
    """A text stream whose every line becomes a log record of ``logger`` at ``level``."""

    def __init__(self, logger: str, level: int, original) -> None:
        super().__init__()
        self.logger, self.level, self.original = logging.getLogger(logger), level, original
        self.logger.setLevel(level)
        self._part = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._part + text).split("\n")
        self._part = lines.pop()
        for line in lines:
            line = _ANSI.sub("", line).rstrip()
            if line:
                self.logger.log(self.level, line)
        return len(text)


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a command run inside another
    program, such as a test, may replace and close it), or to the stream it stands for when it
    turns lines into records."""

    @property
    def stream(self):  # type: ignore[override]
        stream = sys.stderr
        return stream.original if isinstance(stream, _LinesToRecords) else stream

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def _json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter

    class _JsonFormatter(JsonFormatter):
        def format(self, record: logging.LogRecord) -> str:
            return redact_text(super().format(record))

    return _JsonFormatter("{levelname}{name}{message}{batch}{worker}", style="{", timestamp="time",
                          rename_fields={"levelname": "level", "name": "logger", "message": "event"},
                          json_ensure_ascii=False)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """Log knnmon's records of ``level`` and above, and other libraries' warnings and errors, to
    standard error in format ``fmt`` (module docstring), replacing the root logger's handlers. In
    ``json``, ``sys.stdout`` and ``sys.stderr`` are replaced by streams that log their lines.

    Raises
    ------
    InvalidArgumentError
        ``fmt`` not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"--log-format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    handler = _Stderr()
    handler.addFilter(_Context())
    handler.setFormatter(_json_formatter() if fmt == "json" else
                         _TextFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(max(level, logging.WARNING))  # other libraries: their warnings and errors
    logging.getLogger("knnmon").setLevel(level)
    logging.captureWarnings(True)  # (Python's warnings as records too: in JSON, every line parses)
    _format[:] = [fmt]
    if fmt == "json":
        if not isinstance(sys.stdout, _LinesToRecords):
            sys.stdout = _LinesToRecords("stdout", logging.INFO, sys.stdout)
        if not isinstance(sys.stderr, _LinesToRecords):
            sys.stderr = _LinesToRecords("stderr", logging.WARNING, sys.stderr)
        adopt("ray")


def adopt(name: str) -> None:
    """With ``json`` configured, make logger ``name`` (a library's that writes on its own, such
    as Ray's ``ray``, set up when Ray is imported) pass its records to knnmon's handler instead;
    otherwise nothing. Call it again after the library configured itself."""
    if _format != ["json"]:
        return
    logger = logging.getLogger(name)
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.propagate = True
