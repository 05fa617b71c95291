"""``knnmon serve`` (the service, :mod:`knnmon.coordinator.serve`) and ``knnmon status``."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.coordinator.run import add_store_arguments, redis_for_reading
from knnmon.coordinator.serve import ServeConfig, Service
from knnmon.coordinator.status import format_status, read_status
from knnmon.errors import KnnmonError

__all__ = ["add_serve_commands"]


def _serve(a: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ServeConfig(workers=a.workers, algorithm=a.algorithm, objects_dir=a.objects, initial=a.initial,
                         redis_url=a.redis,
                         namespace=a.namespace, data_dir=a.data_dir, ray_address=a.ray_address, executor=a.executor,
                         batch=a.batch, max_delay_ms=a.max_delay_ms)
    with Service(config) as svc:
        print(f"knnmon serve: {config.workers} workers ({config.algorithm}), Redis {svc.redis_url}, namespace "
              f"{config.namespace!r}; XADD to {svc.keys.ingest_queries} / {svc.keys.ingest_objects}", flush=True)
        counters = svc.run(max_batches=a.max_batches, idle_exit_s=a.idle_exit_s)
    print(f"knnmon serve: stopped; {json.dumps(counters)}", flush=True)
    return 0


def _status(a: argparse.Namespace) -> int:
    with redis_for_reading(a.redis, a.data_dir) as url:
        s = read_status(url, a.namespace)
    print(json.dumps(s, indent=2) if a.json else format_status(s))
    if s["service"] is None and not s["queries"]:
        raise KnnmonError(f"nothing in namespace {a.namespace!r}: is `knnmon serve` running against this Redis?")
    return 0


def add_serve_commands(sub: Any) -> None:
    """Register ``serve`` and ``status`` on a root parser's subparsers."""
    s = sub.add_parser("serve", help="run as a service: queries and objects arrive through Redis streams")
    s.add_argument("--workers", type=int, default=2, metavar="W", help="workers (default 2)")
    s.add_argument("--algorithm", default="proposed", choices=sorted(ALGORITHMS),
                   help="assignment of the queries found in Redis at start (default proposed)")
    s.add_argument("--objects", metavar="DIR", help="preload an ingest output: objects seen before the stream")
    s.add_argument("--initial", type=int, metavar="N",
                   help="preload only the first N objects of --objects in stream order (t, id) (default all)")
    s.add_argument("--batch", type=int, default=1000, metavar="B", help="largest object batch (default 1000)")
    s.add_argument("--max-delay-ms", type=float, default=20.0, metavar="MS",
                   help="wait at most this long after a batch's first object for more (default 20)")
    s.add_argument("--ray-address", metavar="ADDR", help="join a Ray cluster (default: a local Ray instance)")
    s.add_argument("--executor", choices=("ray", "inline"), default="ray", help="workers as Ray actors (default) or in process")
    s.add_argument("--max-batches", type=int, metavar="N", help="stop after N object batches (benchmarks, tests)")
    s.add_argument("--idle-exit-s", type=float, metavar="S", help="stop after S seconds with nothing to do")
    add_store_arguments(s)
    s.set_defaults(func=_serve)
    t = sub.add_parser("status", help="what `knnmon serve` is doing: workers, loads, stream lag, rejects")
    t.add_argument("--json", action="store_true", help="print JSON")
    add_store_arguments(t)
    t.set_defaults(func=_status)
