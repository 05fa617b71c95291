"""``knnmon status``: what ``knnmon serve`` is doing (:mod:`knnmon.coordinator.service.status`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from knnmon.coordinator.cli.options import add_verb, add_store_options, store_config
from knnmon.errors import KnnmonError
from knnmon.store import open_store

__all__ = ["add_status_command"]


def _status(a: argparse.Namespace) -> int:
    from knnmon.coordinator.service.status import format_status, read_status

    config = store_config(a)
    with open_store(config, existing=True) as store:
        s = read_status(store.url, config.namespace)
    print(json.dumps(s, indent=2) if a.json else format_status(s))
    if s["service"] is None and not s["queries"]:
        raise KnnmonError(f"nothing in namespace {config.namespace!r}: is `knnmon serve` running against this Redis?")
    return 0


def add_status_command(sub: Any) -> None:
    """Register ``status`` on a root parser's subparsers."""
    t = add_verb(sub, "status", "what `knnmon serve` is doing: workers, loads, stream lag, rejects")
    t.add_argument("--json", action="store_true", help="print JSON")
    add_store_options(t)
    t.set_defaults(func=_status)
