"""knnmon's log lines (``--log-format``): JSON records with their batch and worker, every line
redacted, printed lines turned into records."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from knnmon.errors import InvalidArgumentError
from knnmon.logs import BATCH, WORKER, configure_logging, redact_text


@pytest.fixture
def captured(monkeypatch):
    """``capture()``: standard output and error as buffers from then on (pytest sets its own
    streams only when the test starts); the streams and the logging setup restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("knnmon").level)

    def capture() -> io.StringIO:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stdout", io.StringIO())
        monkeypatch.setattr(sys, "stderr", err)
        return err

    yield capture
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("knnmon").setLevel(saved[2])
    logging.captureWarnings(False)


def test_json_records_carry_the_batch_and_worker_of_their_context(captured):
    err = captured()
    configure_logging("json")
    log = logging.getLogger("knnmon.test")
    batch, worker = BATCH.set(7), WORKER.set(2)
    log.info("applying to redis://app:s3cret@db:6379/0")
    WORKER.reset(worker)
    BATCH.reset(batch)
    log.warning("between batches", extra={"worker": 5})
    try:
        raise ValueError("token=abc123 in a traceback")
    except ValueError:
        log.exception("failed")
    print("a line printed, \x1b[33mcoloured\x1b[0m")  # (sys.stdout is now a stream of records)
    logging.getLogger("other.library").info("not shown: other libraries log at WARNING and above")
    sys.stdout.write("partial ")
    sys.stdout.write("line\n")
    records = [json.loads(line) for line in err.getvalue().splitlines()]
    assert [(r["event"], r["batch"], r["worker"]) for r in records[:2]] == [
        ("applying to redis://app:***@db:6379/0", 7, 2), ("between batches", None, 5)]
    assert records[2]["level"] == "ERROR" and "token=***" in records[2]["exc_info"] and "abc123" not in err.getvalue()
    assert [(r["logger"], r["event"]) for r in records[3:]] == [("stdout", "a line printed, coloured"),
                                                                 ("stdout", "partial line")]
    assert {"time", "level", "logger", "event", "batch", "worker"} <= records[0].keys()


def test_text_lines_are_redacted_too(captured):
    err = captured()
    configure_logging("text")
    logging.getLogger("knnmon.test").warning("connect rediss://:pw@host:6380/0?password=pw")
    line = err.getvalue().strip()
    assert line.endswith("knnmon.test WARNING connect rediss://:***@host:6380/0?password=***") and "pw@" not in line


def test_an_unknown_format_is_refused(captured):
    with pytest.raises(InvalidArgumentError, match="--log-format"):
        configure_logging("xml")


def test_redact_text():
    assert redact_text("redis://user:p%40ss@h:1/0 and http://h/x?Password=1&a=2") == \
        "redis://user:***@h:1/0 and http://h/x?Password=***&a=2"
    assert redact_text("redis://127.0.0.1:6379/0 has none") == "redis://127.0.0.1:6379/0 has none"
