"""``knnmon serve``: the long-running service (:mod:`knnmon.coordinator.service`)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
from typing import Any

from knnmon.connection import redact
from knnmon.coordinator.cli.options import (add_batch_option, announce_first_compile, add_index_option,
                                            add_limit_options,
                                            add_log_format_option, add_rebalance_options, add_store_options, add_verb,
                                            add_window_options, add_worker_options, runtime_settings, store_config)
from knnmon.coordinator.service.batching import POLICIES
from knnmon.coordinator.service.config import SERVE_REDIS_WAIT_S
from knnmon.coordinator.service.probes import DEFAULT_ADDRESS, parse_address
from knnmon.coordinator.service.telemetry import DEFAULT_MAX_LAG

__all__ = ["add_serve_command"]


def _serve(a: argparse.Namespace) -> int:
    from knnmon.coordinator.service.config import ServeConfig
    from knnmon.coordinator.service.loop import Service

    from knnmon.coordinator.runtime.config import RunConfig
    from knnmon.logs import configure_logging

    configure_logging(a.log_format)
    # `kill -USR1 PID`: every thread's stack, as plain text, to the process's stderr (a hang)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__)
    # In JSON, every line of the output is a log record.
    say = logging.getLogger("knnmon.serve").info if a.log_format == "json" else (lambda m: print(m, flush=True))

    run = RunConfig(**runtime_settings(a), initial=0, store=store_config(a, durable=True), overlap_writes=False,
                    redis_wait_s=a.redis_wait)
    config = ServeConfig(run=run, objects_dir=a.objects, initial=a.initial, max_delay_ms=a.max_delay_ms,
                         checkpoint_interval_s=a.checkpoint_interval, batching=a.batching,
                         latency_target_ms=a.latency_target_ms, replan=a.replan,
                         metrics=parse_address(a.metrics), ready_max_lag=a.ready_max_lag)
    announce_first_compile(say)
    with Service(config) as svc:
        life = svc.life
        say(f"knnmon serve: {config.run.workers} workers ({config.run.algorithm}), Redis {redact(life.redis_url)}, "
            f"namespace {config.run.store.namespace!r}; XADD to {life.keys.ingest_queries} / {life.keys.ingest_objects}"
            + (f"; metrics on http://{life.probes.address}/metrics" if life.probes is not None else ""))
        counters = svc.run(max_batches=a.max_batches, idle_exit_s=a.idle_exit_s)
    say(f"knnmon serve: stopped; {json.dumps(counters)}")
    return 0


def add_serve_command(sub: Any) -> None:
    """Register ``serve`` on a root parser's subparsers."""
    s = add_verb(sub, "serve", "run as a service: queries and objects arrive through Redis streams")
    add_worker_options(s, algorithm_help="assignment of the queries found in Redis at start")
    s.add_argument("--objects", metavar="DIR", help="preload an ingest output: objects seen before the stream")
    s.add_argument("--initial", type=int, metavar="N",
                   help="preload only the first N objects of --objects in stream order (t, id) (default all)")
    add_batch_option(s, "largest object batch")
    s.add_argument("--batching", choices=POLICIES, default="adaptive",
                   help="how batches form: wait up to --max-delay-ms for more (fixed), never wait (no-wait), or "
                        "never wait and cut what queued into minibatches sized for --latency-target-ms from the "
                        "measured arrival rate and cost (adaptive, default); docs/batching.md")
    s.add_argument("--max-delay-ms", type=float, default=20.0, metavar="MS",
                   help="with --batching fixed: wait at most this long after a batch's first object for more "
                        "(default 20)")
    s.add_argument("--latency-target-ms", type=float, default=50.0, metavar="MS",
                   help="with --batching adaptive: the response time (publish to result) minibatches are sized for "
                        "(default 50)")
    add_index_option(s, "serve")
    add_limit_options(s)
    add_window_options(s, arrival=False)
    add_rebalance_options(s)
    s.add_argument("--redis-wait", type=float, default=SERVE_REDIS_WAIT_S, metavar="S",
                   help="when Redis stops answering (a restart), the service and its workers retry for S seconds "
                        f"before they rebuild from it (default {SERVE_REDIS_WAIT_S:g})")
    s.add_argument("--checkpoint-interval", type=float, default=60.0, metavar="S",
                   help="with --window: seconds between checkpoints, which trim the objects stream to what "
                        "the window still needs (default 60)")
    s.add_argument("--replan", action="store_true",
                   help="at start, search every registered query's kNN again and plan the assignment anew (a full "
                        "recovery) instead of starting the workers from the results Redis holds, where each query "
                        "stays on its worker")
    s.add_argument("--metrics", default=os.environ.get("KNNMON_METRICS") or DEFAULT_ADDRESS, metavar="HOST:PORT",
                   help="serve Prometheus metrics at /metrics, and the probes /healthz and /readyz, on HOST:PORT "
                        "(port 0: any free one, shown by knnmon status); off: none (default $KNNMON_METRICS, "
                        f"else {DEFAULT_ADDRESS})")
    s.add_argument("--ready-max-lag", type=int, default=DEFAULT_MAX_LAG, metavar="N",
                   help="/readyz fails while more than N entries wait in the ingest streams")
    add_log_format_option(s)
    s.add_argument("--max-batches", type=int, metavar="N", help="stop after N object batches (benchmarks, tests)")
    s.add_argument("--idle-exit-s", type=float, metavar="S", help="stop after S seconds with nothing to do")
    add_store_options(s)
    s.set_defaults(func=_serve)
