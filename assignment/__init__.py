"""Query-to-worker assignment: pure, deterministic numpy (no Ray, Redis or Spark).

- :mod:`~knnmon.assignment.loadmodel` -- ``P(c, key)``, regions ``R_q``, loads and deliveries
  (Tsuruoka et al. 2019, §4.2);
- :mod:`~knnmon.assignment.proposed` -- Algorithms 1 and 2 (§4.3);
- :mod:`~knnmon.assignment.keyword`, :mod:`~knnmon.assignment.space`,
  :mod:`~knnmon.assignment.randomized` -- the baselines (§5);
- :mod:`~knnmon.assignment.routing` -- a plan's routing table (cell x keyword -> workers), as
  built (a run's additions and withdrawals: :mod:`knnmon.coordinator.live_routing`);
- :mod:`~knnmon.assignment.summary` -- predicted worker loads, imbalance, deliveries.
"""

from __future__ import annotations

from typing import Any

from knnmon.assignment.base import Assigner, Plan, QuerySet
from knnmon.assignment.keyword import KeywordAssigner
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.proposed import ProposedAssigner
from knnmon.assignment.randomized import RandomAssigner
from knnmon.assignment.space import SpaceAssigner
from knnmon.assignment.workload import Workload
from knnmon.errors import InvalidArgumentError

__all__ = ["ALGORITHMS", "Assigner", "LoadModel", "Plan", "QuerySet", "Workload", "make_assigner"]

#: ``--algorithm`` name -> class.
ALGORITHMS: dict[str, type[Assigner]] = {
    "proposed": ProposedAssigner, "keyword": KeywordAssigner, "space": SpaceAssigner, "random": RandomAssigner,
}


def make_assigner(name: str, **params: Any) -> Assigner:
    """An assigner by ``--algorithm`` name; ``params`` it does not take are ignored.

    Raises
    ------
    InvalidArgumentError
        For an unknown name (the message lists the valid ones).
    """
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise InvalidArgumentError(f"Invalid algorithm: {name!r}.\nValid options are: {tuple(ALGORITHMS)}")
    import inspect

    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in params.items() if k in accepted})
