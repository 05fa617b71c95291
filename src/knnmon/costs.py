"""What a worker's time is made of: the cost model the assignment balances.

The paper (Tsuruoka et al. 2019, §4.2, formula (8)) balances ``L(q) = sum_key P(R_q, key)``,
the expected keyword matches per arriving object inside ``q``'s region: the candidates ``q``
causes. knnmon's workers prune candidates with a keyword-aware grid, so a candidate costs almost
nothing; a worker's busy time is made of a fixed cost per batch, the objects delivered to it
and the results that change. Fitted by least squares on measured per-worker busy times (``knnmon
bench``, 100 k queries, W = 4 and 12, proposed/keyword/random, R^2 = 0.98; docs/benchmarks.md):

    busy(w) = 1.25 ms per batch + 10.9 us per delivered object + 0.036 us per candidate
              + 33 us per changed result

A fit on today's workers gives other weights (5.2 ms per batch, 5.5 us per delivery, 0.22 us per
candidate, 18.4 us per change; R^2 0.97), but plans made with them were 1.00-1.02x faster than
random on 100 k queries where these are 1.13-1.15x (docs/performance.md, "What we
learned"): the planner keeps these.

**Expected changes** [ours]: with objects drawn from the distribution of the initial ``N0``
objects, the next object changes ``q``'s result exactly when it matches ``q`` and falls inside
``r_q``; ``count_q`` initial objects do (``min(k, matches)``), so the rate is ``count_q / N0``
per arriving object, wherever ``q`` is. The measured model therefore balances

    cost(q) = candidate_us * L(q) + change_us * count_q / N0          [us per arriving object]

and weighs deliveries with ``delivery_us`` (the ``lambda`` of the total cost ``C``).
"""

from __future__ import annotations

from dataclasses import dataclass

from knnmon.errors import InvalidArgumentError

__all__ = ["COST_MODELS", "FIXED_MS", "CostModel"]

COST_MODELS = ("measured", "paper")
#: A worker's busy time per batch that no query causes (ms): the fit's per-batch term (above).
FIXED_MS = 1.25


@dataclass(frozen=True)
class CostModel:
    """Weights of a query's work terms and of a delivery (module docstring).

    Attributes
    ----------
    name : ``"measured"`` or ``"paper"``
    candidate : weight of ``L(q)`` (expected candidates per arriving object)
    change : weight of ``count_q / N0`` (expected result changes per arriving object)
    delivery : weight of ``D(S)`` (expected deliveries per arriving object), ``lambda``
    """

    name: str
    candidate: float
    change: float
    delivery: float

    @classmethod
    def named(cls, name: str, delivery_cost: float | None = None) -> CostModel:
        """``"measured"`` (microseconds, fitted; the default) or ``"paper"`` (``L(q)`` only, with
        ``lambda = delivery_cost``, default 1). ``delivery_cost`` overrides the delivery weight.

        Raises
        ------
        InvalidArgumentError
            An unknown name, or a negative ``delivery_cost``.
        """
        if delivery_cost is not None and delivery_cost < 0:
            raise InvalidArgumentError(f"plan.delivery_cost must be >= 0; got {delivery_cost}")
        if name == "measured":
            return cls(name, 0.036, 33.0, 10.9 if delivery_cost is None else delivery_cost)
        if name == "paper":
            return cls(name, 1.0, 0.0, 1.0 if delivery_cost is None else delivery_cost)
        raise InvalidArgumentError(f"Invalid cost model: {name!r}.\nValid options are: {COST_MODELS}")
