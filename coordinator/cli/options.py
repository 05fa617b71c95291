"""Flags that several ``knnmon`` verbs share, declared once with one default each."""

from __future__ import annotations

import argparse

from knnmon.assignment import ALGORITHMS
from knnmon.assignment.costs import COST_MODELS
from knnmon.assignment.routing import MAX_ENTRIES
from knnmon.keys import DEFAULT_NAMESPACE
from knnmon.store import DEFAULT_DATA_DIR, StoreConfig

__all__ = ["DEFAULT_BATCH", "DEFAULT_WORKERS", "add_batch_option", "add_cluster_options", "add_cost_model_option", "add_routing_entries_option",
           "add_store_options", "add_worker_options", "store_config"]

#: Workers of ``run`` and ``serve`` (and the demo): one per core of the 2-core reference machine.
DEFAULT_WORKERS = 2
#: Objects per batch.
DEFAULT_BATCH = 1000


def add_store_options(p: argparse.ArgumentParser, *, data_dir: bool = True, namespace: str = DEFAULT_NAMESPACE) -> None:
    """``--redis``, ``--namespace`` and (with ``data_dir``) ``--data-dir``: where results live
    (:class:`~knnmon.store.StoreConfig`)."""
    where = "the embedded server" if data_dir else "an embedded server, not saved"
    p.add_argument("--redis", metavar="URL", help=f"Redis URL (default $KNNMON_REDIS_URL, else {where})")
    p.add_argument("--namespace", default=namespace, help=f"Redis key prefix (default {namespace})")
    if data_dir:
        p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                       help=f"where the embedded Redis keeps its data (default ./{DEFAULT_DATA_DIR})")


def store_config(a: argparse.Namespace, *, durable: bool = False) -> StoreConfig:
    """The :class:`StoreConfig` of :func:`add_store_options`' flags."""
    return StoreConfig(url=a.redis, namespace=a.namespace, data_dir=getattr(a, "data_dir", None), durable=durable)


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


def add_batch_option(p: argparse.ArgumentParser, what: str = "objects per batch") -> None:
    """``--batch B``."""
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="B", help=f"{what} (default {DEFAULT_BATCH})")


def add_cost_model_option(p: argparse.ArgumentParser) -> None:
    """``--cost-model``: what a plan balances (:mod:`knnmon.assignment.costs`)."""
    p.add_argument("--cost-model", choices=COST_MODELS, default="measured",
                   help="what the plan balances: the measured worker cost (deliveries and expected result "
                        "changes; default) or the paper's L(q) (expected keyword matches); docs/assignment.md")


def add_routing_entries_option(p: argparse.ArgumentParser) -> None:
    """``--routing-entries N``: the routing table's bound."""
    p.add_argument("--routing-entries", type=int, default=MAX_ENTRIES, metavar="N",
                   help=f"bound the routing table at N (keyword, cell) entries, ~16 bytes each (default "
                        f"{MAX_ENTRIES:,}); beyond it, the (worker, keyword) pairs that add the fewest deliveries "
                        "are routed everywhere instead (results stay exact)")
