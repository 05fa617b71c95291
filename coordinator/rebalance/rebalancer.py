"""Re-balancing, per batch: observe, and when due, re-plan and move (package docstring).

:meth:`Rebalancer.after_batch` is called by the runtime after each collected batch (``knnmon
run`` and ``knnmon serve`` alike), between two dispatches. A re-plan asks every worker for its
queries' measured loads, plans a bounded move (:func:`~.planner.plan_moves`), carries it out
(:func:`~.migration.migrate`), asks for a routing-table rebuild (the sources' entries for moved
queries go), and records itself: in :attr:`Rebalancer.replans` and, newest first, in Redis
(``knn:replans``, :class:`~knnmon.keys.Keys`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from knnmon.connection import connect, with_retries
from knnmon.coordinator.rebalance.config import RebalanceConfig
from knnmon.coordinator.rebalance.migration import gather_reviving, migrate
from knnmon.coordinator.rebalance.monitor import LoadMonitor
from knnmon.coordinator.rebalance.planner import plan_moves
from knnmon.keys import REPLANS_KEPT, Keys

__all__ = ["Rebalancer"]

log = logging.getLogger("knnmon.rebalance")


class Rebalancer:
    """Re-balancing of one run (module docstring).

    Parameters
    ----------
    pool, registrar
        The run's workers and who holds which query.
    upkeep
        The run's routing upkeep (a rebuild is requested after a move).
    set_of
        Query id -> its set in the plan (queries registered later have none).
    config
        :class:`RebalanceConfig`.
    redis_url, namespace
        Where the re-plan records go (``None``: kept in memory only).
    revive
        ``revive(worker) -> bool``: revives a lost worker in place (the runtime's
        ``revive_idle``); used by a re-plan with no batch in flight (``idle``), so that a loss
        during a move does not stop the run (:func:`~.migration.migrate`).

    Attributes
    ----------
    replans : list of dict
        Every re-plan: ``batch``, ``trigger`` (slowest / mean busy over the window),
        ``busy_ms``, ``predicted_ms``, ``predicted_gain``, ``queries_moved``, ``moves``,
        ``seconds``.
    queries_moved : int
        In all re-plans so far.
    """

    def __init__(self, pool, registrar, upkeep, set_of: Mapping[str, int], config: RebalanceConfig | None = None, *,
                 redis_url: str | None = None, namespace: str = "knn",
                 revive: Callable[[int], bool] | None = None) -> None:
        self.pool, self.registrar, self.upkeep, self.set_of = pool, registrar, upkeep, set_of
        self.config = config or RebalanceConfig()
        self.redis_url, self.keys = redis_url, Keys(namespace)
        self.monitor = LoadMonitor(pool.size, self.config.window, self.config.threshold)
        self.replans: list[dict[str, Any]] = []
        self.queries_moved = 0
        self._numbered = self._last_number()  # a resumed service's re-plans continue the count
        self._recent: deque[list[str]] = deque(maxlen=max(self.config.cooldown, 1))  # moved lately
        self.revive = revive

    def after_batch(self, batch: int, busy_ms, *, idle: bool = False) -> dict[str, Any] | None:
        """Observe batch ``batch``'s per-worker busy times ``(W,)`` ms; re-plan if due. Returns
        the re-plan's record, if one ran. ``idle``: no batch is in flight (a lost worker is
        revived in place, :attr:`revive`)."""
        self.monitor.observe(busy_ms)
        if not self.monitor.due():
            return None
        return self.replan(batch, idle=idle)

    def replan(self, batch: int, *, idle: bool = False) -> dict[str, Any]:
        """Re-plan and move now (after batch ``batch``); returns the record. ``idle``: as in
        :meth:`after_batch`."""
        t0 = time.perf_counter()
        trigger = self.monitor.ratio()
        busy = self.monitor.busy()
        revive = self.revive if idle else None
        loads = gather_reviving(self.pool, [(w, lambda w=w: self.pool.query_loads(w)) for w in range(self.pool.size)],
                                revive)
        n_queries = sum(len(ids) for ids, _ in loads)
        budget = int(self.config.budget * n_queries)
        frozen = frozenset(q for moved in self._recent for q in moved)
        plan = plan_moves(busy, loads, self.set_of, budget, min_gain=self.config.min_gain,
                          min_total_gain=self.config.min_total_gain, frozen=frozen, strategy=self.config.strategy)
        self._numbered += 1
        number = self._numbered
        moved = 0
        if plan.moves:
            note = {"moved_batch": str(batch), "moved_replan": str(number)}
            moved = migrate(self.pool, self.registrar, plan.moves, note=note, revive=revive)["queries"]
            self.upkeep.request()
        if self.config.cooldown:
            self._recent.append([q for m in plan.moves for q in m.qids])
        self.queries_moved += moved
        self.monitor.reset()
        record = {"replan": number, "batch": batch, "trigger": round(trigger, 4),
                  "busy_ms": [round(float(x), 3) for x in plan.busy_ms],
                  "predicted_ms": [round(float(x), 3) for x in plan.predicted_ms],
                  "predicted_gain": round(plan.predicted_gain, 4), "queries_moved": moved, "budget": budget,
                  "moves": [{"source": m.source, "target": m.target, "queries": len(m.qids),
                             "predicted_ms": round(m.predicted_ms, 3), "unit": m.unit[:200]} for m in plan.moves],
                  "seconds": round(time.perf_counter() - t0, 4)}
        self.replans.append(record)
        self._record(record)
        log.info("re-plan %d after batch %d: slowest/mean busy %.2f, %d queries moved, predicted gain %.1f %%, "
                 "%.2f s", number, batch, trigger, moved, 100 * plan.predicted_gain, record["seconds"])
        return record

    def _last_number(self) -> int:
        """The number of the newest re-plan recorded in Redis (0: none, or unreadable)."""
        if self.redis_url is None:
            return 0
        client = connect(self.redis_url)
        try:
            head = with_retries(lambda: client.lindex(self.keys.replans, 0), "reading the re-plans", self.redis_url)
            number = json.loads(head).get("replan", 0) if head else 0
            return number if isinstance(number, int) and number >= 0 else 0
        except (ValueError, AttributeError):
            return 0
        finally:
            client.close()

    def _record(self, record: dict[str, Any]) -> None:
        if self.redis_url is None:
            return
        client = connect(self.redis_url)
        try:
            def write():
                client.lpush(self.keys.replans, json.dumps(record))
                client.ltrim(self.keys.replans, 0, REPLANS_KEPT - 1)
            with_retries(write, "recording a re-plan", self.redis_url)
        finally:
            client.close()
