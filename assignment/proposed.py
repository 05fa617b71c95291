"""The proposed assignment: Queryset-Partition (Algorithm 1) + Query-Assignment (Algorithm 2).

Tsuruoka, Nishio, Amagata, Hara, IPSJ TOD 12(4), 2019, §4.3; ``docs/concepts.md``.

**Algorithm 1.** Start from one set holding every query. Repeatedly take the heaviest set (by
work ``L(Q)``) and split it into up to 4:

- *SpacePartition*: the quadrants of the bounding box of the set's query locations; each query
  goes to the quadrant holding its location (sets stay disjoint in space).
- *TextPartition*: keywords of the set are dealt into 4 groups, heaviest keyword (by its load
  in the set) first onto the lightest group; each query joins the group of its heaviest keyword,
  so queries sharing that keyword stay together.
- A set of more than ``beta`` queries is split by space, which needs no cost evaluation.
  Otherwise both splits are computed and the one with the smaller total cost
  ``C = sum_i (L(Q_i) + lambda * D(Q_i))`` is kept (paper formulas (11), (12), with the
  delivery term ``D`` of :mod:`knnmon.assignment.loadmodel` [ours]: ``sum_i L(Q_i)`` is the same
  for both splits, so without ``D`` the choice would be empty, as the paper notes for ``C_s``).
- A split that leaves all queries in one group is not a split. If neither kind can split the
  set, the set is final.
- **Stop** [ours, the paper's α roles are lost]: at ``sets_per_worker * W`` sets, or when no
  set can be split.

**Algorithm 2.** ``handout="set"`` (default): sets by decreasing cost
``L(Q) + lambda * D(Q)``, each to the least-loaded worker, with the whole set kept together.
``handout="query"`` is the paper's pseudo-code as printed: the sets' queries are handed out one by
one (sets by decreasing load, queries by decreasing load) to the least-loaded worker.
Keeping a set together saves deliveries. Both are available so that both can be measured.
"""

from __future__ import annotations

import heapq

import numpy as np

from knnmon.assignment.base import Assigner, Plan, QuerySet, deal_keywords, lpt
from knnmon.assignment.loadmodel import LoadModel
from knnmon.assignment.workload import Workload
from knnmon.errors import InvalidArgumentError

__all__ = ["ProposedAssigner"]

_QUADRANTS = ("SW", "SE", "NW", "NE")


class ProposedAssigner(Assigner):
    """The paper's load-balanced space-vs-keyword partitioning and greedy assignment.

    Parameters
    ----------
    beta : int
        Sets with more than ``beta`` queries are split by space without cost evaluation
        (paper: 100,000).
    sets_per_worker : int
        Stop splitting at ``sets_per_worker * W`` sets (default 8).
    delivery_cost : float
        ``lambda``: the cost of one delivery relative to one keyword match (default 1.0).
    handout : {"set", "query"}
        Algorithm 2 with whole sets (default) or query by query as printed in the paper.
    """

    name = "proposed"

    def __init__(self, beta: int = 100_000, sets_per_worker: int = 8, delivery_cost: float = 1.0,
                 handout: str = "set") -> None:
        if beta < 1:
            raise InvalidArgumentError(f"plan.beta must be >= 1; got {beta}")
        if sets_per_worker < 1:
            raise InvalidArgumentError(f"sets_per_worker must be >= 1; got {sets_per_worker}")
        if delivery_cost < 0:
            raise InvalidArgumentError(f"delivery_cost must be >= 0; got {delivery_cost}")
        if handout not in ("set", "query"):
            raise InvalidArgumentError(f"Invalid handout: {handout!r}.\nValid options are: ('set', 'query')")
        self.beta, self.sets_per_worker, self.delivery_cost, self.handout = beta, sets_per_worker, delivery_cost, handout

    # -- Algorithm 1 -------------------------------------------------------------------------
    def _space(self, wl: Workload, s: QuerySet) -> list[QuerySet]:
        lon, lat = wl.lon[s.members], wl.lat[s.members]
        box = (float(lon.min()), float(lat.min()), float(lon.max()), float(lat.max()))
        if box[0] == box[2] and box[1] == box[3]:
            return []
        mid_lon, mid_lat = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        quadrant = (lon > mid_lon).astype(np.int8) + 2 * (lat > mid_lat).astype(np.int8)
        out = []
        for qd in range(4):
            members = s.members[quadrant == qd]
            if len(members):
                east, north = qd & 1, qd >> 1
                region = (mid_lon if east else box[0], mid_lat if north else box[1],
                          box[2] if east else mid_lon, box[3] if north else mid_lat)
                out.append(QuerySet(members, float(wl.load[members].sum()),
                                    s.history + [f"space: quadrant {_QUADRANTS[qd]} of lon [{box[0]:.4f}, {box[2]:.4f}]"
                                                 f" lat [{box[1]:.4f}, {box[3]:.4f}]"], region))
        return out

    def _text(self, wl: Workload, s: QuerySet) -> list[QuerySet]:
        e = wl.entries(s.members)
        keys, key_load, key_group, q_of, g_of = deal_keywords(wl.owner[e], wl.code[e], wl.entry_load[e], 4)
        if len(keys) < 2:
            return []
        out = []
        for g in range(4):
            members = q_of[g_of == g]
            if len(members):
                top = [wl.vocabulary[int(c)] for c in keys[key_group == g][np.argsort(-key_load[key_group == g])][:3]]
                out.append(QuerySet(members, float(wl.load[members].sum()),
                                    s.history + [f"text: keyword group {g + 1} of 4 (heaviest: {', '.join(top)})"],
                                    s.region))
        return out

    def _cost(self, wl: Workload, model: LoadModel, children: list[QuerySet]) -> float:
        for c in children:
            if c.deliveries is None:
                c.deliveries = wl.deliveries(model, c.members)
        return sum(c.work + self.delivery_cost * c.deliveries for c in children)

    def _split(self, wl: Workload, model: LoadModel, s: QuerySet) -> list[QuerySet] | None:
        if len(s.members) < 2:
            return None
        space = self._space(wl, s)
        if len(s.members) > self.beta and len(space) >= 2:
            return space
        text = self._text(wl, s)
        options = [c for c in (space, text) if len(c) >= 2]
        if not options:
            return None
        if len(options) == 1:
            return options[0]
        c_s, c_t = self._cost(wl, model, space), self._cost(wl, model, text)
        return space if c_s < c_t else text

    def partition(self, wl: Workload, model: LoadModel, n_sets: int) -> list[QuerySet]:
        """Algorithm 1: split the heaviest set until ``n_sets`` sets or none can be split."""
        root = QuerySet(np.arange(len(wl), dtype=np.int64), float(wl.load.sum()), [], model.grid_region)
        heap: list[tuple[float, int, QuerySet]] = [(-root.work, 0, root)]
        final: list[QuerySet] = []
        counter = 1
        while heap and len(heap) + len(final) < n_sets:
            _, _, s = heapq.heappop(heap)
            children = self._split(wl, model, s)
            if children is None:
                final.append(s)
                continue
            for c in children:
                heapq.heappush(heap, (-c.work, counter, c))
                counter += 1
        return final + [s for _, _, s in sorted(heap, key=lambda h: (h[0], h[1]))]

    # -- Algorithm 2 -------------------------------------------------------------------------
    def assign(self, workload: Workload, model: LoadModel, workers: int) -> Plan:
        self.check_workers(workers)
        sets = self.partition(workload, model, self.sets_per_worker * workers)
        params = {"beta": self.beta, "sets_per_worker": self.sets_per_worker,
                  "delivery_cost": self.delivery_cost, "handout": self.handout}
        if self.handout == "set":
            cost = np.array([self._cost(workload, model, [s]) for s in sets])
            return self._plan_from_sets(workload, sets, lpt(cost, workers), workers, params)
        # The paper's printed Algorithm 2: query by query.
        worker = np.empty(len(workload), dtype=np.int32)
        loads = [(0.0, w) for w in range(workers)]
        for s in sorted(sets, key=lambda s: -s.work):
            for q in s.members[np.argsort(-workload.load[s.members], kind="stable")].tolist():
                load, w = heapq.heappop(loads)
                worker[q] = w
                heapq.heappush(loads, (load + float(workload.load[q]), w))
        set_of = np.empty(len(workload), dtype=np.int32)
        for i, s in enumerate(sets):
            set_of[s.members] = i
        return Plan(self.name, workers, worker, set_of, sets, np.full(len(sets), -1, dtype=np.int32), params)
