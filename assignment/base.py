"""What every assignment algorithm returns, and the interface it implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload
from knnmon.errors import InvalidArgumentError

__all__ = ["Assigner", "Plan", "QuerySet", "deal_keywords", "lpt"]


@dataclass
class QuerySet:
    """A set of queries kept together on one worker.

    Attributes
    ----------
    members : ``(q,)`` int64 query indices
    work : float, ``L(Q)`` (formula (9))
    history : list of str, how the set came about (for ``--explain``)
    region : ``(min_lon, min_lat, max_lon, max_lat)`` degrees, for space splits
    deliveries : float or None, ``D(Q)`` once computed
    """

    members: np.ndarray
    work: float
    history: list[str] = field(default_factory=list)
    region: tuple[float, float, float, float] = (-180.0, -90.0, 180.0, 90.0)
    deliveries: float | None = None


@dataclass
class Plan:
    """An assignment of every query to one worker.

    Attributes
    ----------
    algorithm : str
    workers : int
    worker : ``(m,)`` int32, the worker of each query
    set_of : ``(m,)`` int32, the set of each query (index into ``sets``)
    sets : list of :class:`QuerySet`
    set_worker : ``(len(sets),)`` int32
    params : dict, the algorithm's parameters
    """

    algorithm: str
    workers: int
    worker: np.ndarray
    set_of: np.ndarray
    sets: list[QuerySet]
    set_worker: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


def lpt(costs: np.ndarray, workers: int) -> np.ndarray:
    """Longest-processing-time greedy: items by decreasing cost, each to the least-loaded worker.

    Paper Algorithm 2 applied to whole items. Ties go to the lower index, so the result is
    deterministic. Returns ``(len(costs),)`` int32 worker per item.
    """
    out = np.empty(len(costs), dtype=np.int32)
    loads = np.zeros(workers)
    for i in np.argsort(-np.asarray(costs, dtype=np.float64), kind="stable"):
        w = int(np.argmin(loads))
        out[i] = w
        loads[w] += costs[i]
    return out


def deal_keywords(owner: np.ndarray, code: np.ndarray, entry_load: np.ndarray, groups: int):
    """Deal keywords onto ``groups`` by load (LPT) and put each query with its heaviest keyword.

    Parameters
    ----------
    owner, code, entry_load
        ``(e,)`` (query, keyword code, ``P(R_q, key)``) entries.

    Returns
    -------
    keys : ``(u,)`` int64 distinct codes; key_load : ``(u,)`` float64 summed entry loads;
    key_group : ``(u,)`` int32 group of each keyword; queries : ``(q,)`` int64 the queries with
    entries; query_group : ``(q,)`` int32 the group of each one's heaviest keyword (ties: the
    keyword that comes first in the query's entries).
    """
    keys, inv = np.unique(code, return_inverse=True)
    key_load = np.bincount(inv, weights=entry_load, minlength=len(keys))
    key_group = lpt(key_load, groups)
    order = np.lexsort((-key_load[inv], owner))
    first = np.ones(len(order), dtype=bool)
    first[1:] = owner[order][1:] != owner[order][:-1]
    return keys, key_load, key_group, owner[order][first], key_group[inv][order][first]


class Assigner(ABC):
    """An assignment algorithm: a pure, deterministic function of workload, model and W."""

    #: The ``--algorithm`` name.
    name: str = ""

    @abstractmethod
    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        """Assign every query of ``workload`` to one of ``workers`` workers.

        Raises
        ------
        InvalidArgumentError
            If ``workers < 1``.
        """

    @staticmethod
    def check_workers(workers: int) -> None:
        """Raise :class:`InvalidArgumentError` unless ``1 <= workers <= 64``."""
        if not 1 <= workers <= 64:
            raise InvalidArgumentError(f"--workers must be between 1 and 64; got {workers}")

    def _plan_from_sets(self, workload: Workload, sets: list[QuerySet], set_worker: np.ndarray, workers: int,
                        params: dict[str, Any]) -> Plan:
        worker = np.empty(len(workload), dtype=np.int32)
        set_of = np.empty(len(workload), dtype=np.int32)
        for i, s in enumerate(sets):
            worker[s.members] = set_worker[i]
            set_of[s.members] = i
        return Plan(self.name, workers, worker, set_of, sets, np.asarray(set_worker, dtype=np.int32), params)
