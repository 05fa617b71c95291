"""``knnmon repair --watermark``: undo objects from the future that an earlier knnmon applied
(:mod:`knnmon.coordinator.service.repair`)."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.coordinator.cli.options import add_store_options, add_verb, setting_flag, settings_of
from knnmon.errors import KnnmonError, InvalidArgumentError
from knnmon.keys import Keys
from knnmon.store import open_store

__all__ = ["add_repair_command"]


def _repair(a: argparse.Namespace) -> int:
    from knnmon.connection import connect
    from knnmon.coordinator.service.repair import repair_watermark
    from knnmon.coordinator.service.status import running_service

    if not a.watermark:
        raise InvalidArgumentError("say what to repair: --watermark")
    settings = settings_of(a).settings
    config = settings.store_config(durable=True)
    keys = Keys(config.namespace)
    with open_store(config, existing=True) as store:
        client = connect(store.url)
        try:
            other = running_service(client, keys)
            if other is not None:
                raise KnnmonError(f"a knnmon serve (pid {other.get('pid')} on {other.get('host')}) runs in namespace "
                                  f"{config.namespace!r}: stop it before repairing")
            report = repair_watermark(client, keys, settings.limits_config(), dry_run=a.dry_run)
        finally:
            client.close()
    print("\n".join(f"knnmon repair: {line}" for line in report.lines()))
    if not a.dry_run:
        print("knnmon repair: done; the next `knnmon serve` recomputes every result over the live objects")
    return 0


def add_repair_command(sub: Any) -> None:
    """Register ``repair`` on a root parser's subparsers."""
    r = add_verb(sub, "repair", "repair what an earlier knnmon let a client poison (run with the service stopped)",
                 "Repair a namespace's state with the service stopped. --watermark: reject as `future` the object "
                 "entries an earlier knnmon (or --max-future off) applied from the future, set the objects stream's "
                 "ids back to Redis's clock, and remove a poisoned checkpoint watermark; the next `knnmon serve` "
                 "recomputes every result over the live objects, those rejected as late because of the poison "
                 "included (docs/serve.md, \"Event time\").")
    r.add_argument("--watermark", action="store_true", help="repair the watermark (see above)")
    setting_flag(r, "--max-future", "limits.max_future", metavar="DURATION",
                 help="objects whose t leads their entry id's time by more are rejected (the service's bound)")
    r.add_argument("--dry-run", action="store_true", help="report what would be repaired; change nothing")
    add_store_options(r)
    r.set_defaults(func=_repair)
