"""``knnmon serve``: the long-running service (:mod:`knnmon.coordinator.service`)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import signal
import sys
from typing import Any

from knnmon.connection import redact
from knnmon.coordinator.cli.options import (add_store_options, add_verb, announce_first_compile, setting_flag,
                                            settings_of)

__all__ = ["add_serve_command"]


def _serve(a: argparse.Namespace) -> int:
    from knnmon.coordinator.service.loop import Service
    from knnmon.logs import configure_logging

    settings = settings_of(a).settings
    configure_logging(settings.log.format)
    # `kill -USR1 PID`: every thread's stack, as plain text, to the process's stderr (a hang)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__)
    # In JSON, every line of the output is a log record.
    say = logging.getLogger("knnmon.serve").info if settings.log.format == "json" \
        else (lambda m: print(m, flush=True))
    config = settings.serve_config()
    announce_first_compile(say)
    with Service(config) as svc:
        life = svc.life
        say(f"knnmon serve: {config.run.workers} workers ({config.run.algorithm}), Redis {redact(life.redis_url)}, "
            f"namespace {config.run.store.namespace!r}; XADD to {life.keys.ingest_queries} / {life.keys.ingest_objects}"
            + (f"; metrics on http://{life.probes.address}/metrics" if life.probes is not None else ""))
        counters = svc.run(max_batches=settings.serve.max_batches, idle_exit_s=settings.serve.idle_exit_s)
    say(f"knnmon serve: stopped; {json.dumps(counters)}")
    return 0


def add_serve_command(sub: Any) -> None:
    """Register ``serve`` on a root parser's subparsers: the flags a first day needs; every
    other setting is in ``[serve]`` and the shared sections (``knnmon config``)."""
    s = add_verb(sub, "serve", "run as a service: queries and objects arrive through Redis streams")
    setting_flag(s, "--workers", "workers.count", metavar="W")
    setting_flag(s, "--ray-address", "workers.ray_address", metavar="ADDR")
    setting_flag(s, "--objects", "serve.objects", metavar="DIR")
    setting_flag(s, "--window", "window.size", metavar="DURATION")
    setting_flag(s, "--rebalance", "rebalance.enabled", switch=True)
    setting_flag(s, "--metrics", "serve.metrics", metavar="HOST:PORT")
    setting_flag(s, "--log-format", "log.format", metavar="text|json")
    add_store_options(s)
    s.set_defaults(func=_serve)
