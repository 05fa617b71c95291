"""Re-balancing, per batch: observe, and when due, re-plan and move (package docstring).

:meth:`Rebalancer.after_batch` is called by the runtime after each collected batch (``knnmon
run`` and ``knnmon serve`` alike), between two dispatches. A re-plan asks every worker for its
queries' measured loads, plans a bounded move (:func:`~.planner.plan_moves`), carries it out
(:func:`~.migration.migrate`: the routing table follows the moved queries at once), and
records itself: in :attr:`Rebalancer.replans` and, newest first, in Redis
(``knn:replans``, :mod:`~.records`). :data:`~.records.REALIZED_AFTER` batches later the record
gains the **realised gain**: how much the slowest worker's busy time per batch fell, against the
``predicted_gain`` the plan promised.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig, Replan, ReplanMove
from knnmon.coordinator.rebalance.handover_flight import MovesInFlight, send_moves
from knnmon.coordinator.rebalance.migration import Release, migrate
from knnmon.coordinator.rebalance.monitor import LoadMonitor, SmoothedMonitor
from knnmon.coordinator.rebalance.planner import plan_moves
from knnmon.coordinator.rebalance.records import ReplanRecords

__all__ = ["Rebalancer"]

log = logging.getLogger("knnmon.rebalance")


class Rebalancer:
    """Re-balancing of one run (module docstring).

    Parameters
    ----------
    pool, registrar
        The run's workers and who holds which query.
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
    replans : list of Replan
        Every re-plan (:class:`~knnmon.coordinator.runtime.rebalance_config.Replan`). Its
        ``seconds`` is the stall: how long the dispatch waited at the boundary of the move; the
        loads are waited for and the plan made at the boundary with inline workers, in the
        planning thread with Ray actors; with a hand-over in flight (:mod:`~.handover_flight`)
        ``move_seconds`` is the sending only, ``land_seconds`` the stall at its landing.
    queries_moved : int
        In all re-plans so far.
    """

    def __init__(self, pool, registrar, set_of: Mapping[str, int], config: RebalanceConfig | None = None, *,
                 redis_url: str | None = None, namespace: str = "knn",
                 revive: Callable[[int], bool] | None = None) -> None:
        self.pool, self.registrar, self.set_of = pool, registrar, set_of
        self.config = config or RebalanceConfig()
        c = self.config
        self.monitor = LoadMonitor(pool.size, c.window, c.threshold) if c.trigger == "window" \
            else SmoothedMonitor(pool.size, c.half_life, c.threshold)
        # The largest move so far: (queries, ms its migration took); a move's cost is scaled from
        # it (a small move's fixed part would make a larger one look dear). None: the first move
        # is judged by its gain alone.
        self._largest_move: tuple[int, float] | None = None
        # With the smoothed trigger: the most a re-plan could gain over the horizon (ms) must
        # exceed this before the workers are asked for their loads again: what the last re-plan
        # that moved nothing would have cost, or the imbalance it could not move (0 after a move).
        self._floor_ms = 0.0
        self.replans: list[Replan] = []
        self.queries_moved = 0
        self.records = ReplanRecords(redis_url, namespace)
        self._recent: deque[list[str]] = deque(maxlen=max(self.config.cooldown, 1))  # moved lately
        self.revive = revive
        # A re-plan under way: (batch its loads were asked for after, the slowest/mean busy and
        # the smoothed busy times then, the future of :meth:`_plan`). With Ray actors the loads
        # are gathered and the plan made in the planning thread while batches go on; the move
        # is made at the first batch boundary after it is done.
        self._planning: tuple[int, float, np.ndarray, Future] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # The last move's release, not yet answered (Ray actors): (its record, the Release).
        self._releasing: tuple[Replan, Release] | None = None
        # A move in flight, not landed (Ray actors with batches in flight): (its record, the moves).
        self._flight: tuple[Replan, MovesInFlight] | None = None

    def after_batch(self, batch: int, busy_ms, *, idle: bool = False, wait_moves: bool = True) -> Replan | None:
        """Observe batch ``batch``'s per-worker busy times ``(W,)`` ms; when a re-plan is due,
        ask the workers for their queries' loads and plan (:meth:`_ask`), and move once the plan
        is made (at this boundary with inline workers, at a later one with Ray actors: the
        dispatch does not wait for the loads or the plan). Returns the re-plan's record, if one
        ran. ``idle``: no batch is in flight (a lost worker is revived in place, :attr:`revive`);
        ``wait_moves=False`` (Ray actors): a move's hand-over is not waited for
        (:mod:`~.handover_flight`; it lands at a later boundary)."""
        self.monitor.observe(busy_ms)
        self.records.observe(busy_ms)
        if self._flight is not None:
            if not self._flight[1].ready(self.pool):
                return None
            self._land()
        if self._releasing is not None:
            if not self._releasing[1].ready(self.pool):
                return None
            self._finish_release()
        if self._planning is None and not self._start(batch):
            return None
        return self._carry_out(batch, idle, wait_moves) if self._planning[-1].done() else None

    def _start(self, batch: int) -> bool:
        """Start a re-plan after batch ``batch`` if one is due (:meth:`_ask`); whether it did."""
        if not self.monitor.due():
            return False
        if self.config.trigger == "smoothed" and self._upper_bound_ms() <= self._floor_ms:
            self.monitor.reset()  # (asking every worker for every query's load costs a round trip)
            return False
        self._ask(batch)
        return True

    def _upper_bound_ms(self) -> float:
        """The most a re-plan could gain over the horizon: the slowest worker's smoothed busy
        time down to the mean, per batch, times ``horizon`` (ms)."""
        return self.monitor.excess_ms() * self.config.horizon

    def _finish_release(self) -> None:
        """Narrow the routing table from the last move's release (answered) and say so in its
        record (``entries_narrowed``, in Redis too if it is still the newest)."""
        record, release = self._releasing
        self._releasing = None
        record.entries_narrowed = release.finish(self.pool, self.registrar)
        self.records.store(record, update=True)

    def _land(self) -> None:
        """Land the move in flight (answered: :meth:`MovesInFlight.land`) and complete its record:
        ``queries_moved`` as exported, ``land_seconds`` (the stall at this boundary),
        ``move_phases_ms``; its release is finished at a later boundary."""
        record, flight = self._flight
        self._flight = None
        done = flight.land(self.pool, self.registrar)
        self.queries_moved += done.queries - record.queries_moved
        record.queries_moved, record.land_seconds = done.queries, round(done.seconds, 4)
        record.move_phases_ms = done.phases_ms
        phases = done.phases_ms
        self._note_cost(done.queries, phases["send"] + phases["land"] + phases["export"] + phases["adopt"])
        self._releasing = (record, done.release)
        self.records.store(record, update=True)

    def _note_cost(self, moved: int, ms: float) -> None:
        """Keep a move of ``moved`` queries that cost ``ms`` as the one later moves' costs are
        scaled from, if it is the largest so far (:attr:`_largest_move`)."""
        if moved and (self._largest_move is None or moved >= self._largest_move[0]):
            self._largest_move = (moved, ms)

    def close(self) -> None:
        """Stop the planning thread, waiting for a re-plan in it (its workers answer, or are
        lost: it makes no call after Ray is shut down); the re-plan is dropped, and a release
        not yet answered is not waited for (the routing table is not used after)."""
        self._planning = None
        self._releasing = None
        self._flight = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _ask(self, batch: int) -> None:
        """Ask every worker for its queries' loads (queued behind the batches sent to it), and
        plan: at once with inline workers, in the planning thread with Ray actors."""
        busy, frozen = self.monitor.busy(), frozenset(q for moved in self._recent for q in moved)
        job = (self._plan, [self.pool.query_loads(w) for w in range(self.pool.size)], busy, frozen)
        if self.pool.inline:
            planned: Future = Future()
            planned.set_result(job[0](*job[1:]))
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="knnmon-replan")
            planned = self._executor.submit(*job)
        self._planning = (batch, self.monitor.ratio(), busy, planned)

    def _plan(self, pending: list, busy: np.ndarray, frozen: frozenset[str]):
        """The workers' loads (``pending``: their calls) and :func:`plan_moves` over them with this
        run's settings, the budget a share of the queries: ``(plan, budget, seconds planning,
        seconds waiting for the loads)``; ``None`` when a worker was lost meanwhile."""
        t0 = time.perf_counter()
        loads = self.pool.gather_each(pending)
        if any(isinstance(x, Exception) for x in loads):
            return None
        t1, c = time.perf_counter(), self.config
        budget = int(c.budget * sum(len(ids) for ids, *_ in loads))
        plan = plan_moves(busy, loads, self.set_of, budget, min_gain=c.min_gain, min_total_gain=c.min_total_gain,
                          frozen=frozen)
        return plan, budget, time.perf_counter() - t1, t1 - t0

    def _carry_out(self, batch: int, idle: bool, wait_moves: bool = True) -> Replan | None:
        """Move as planned; the record, or ``None`` when the smoothed trigger finds no move, or
        the moves' predicted gain over ``horizon`` batches no larger than their cost (nothing
        moves, nothing is recorded), or nothing was planned: a worker was lost while it reported
        its loads (the batch that finds it revives it; the trigger judges again), or the predicted
        loads were even."""
        t0 = time.perf_counter()
        asked_at, trigger, measured, planned = self._planning
        self._planning = None
        made = planned.result()
        if made is None:
            log.info("re-plan after batch %d: nothing planned (a worker lost while it reported its loads, or the "
                     "predicted loads even)", batch)
            self.monitor.reset()
            return None
        plan, budget, plan_s, loads_s = made
        revive = self.revive if idle else None
        gain_ms = float(plan.busy_ms.max() - plan.predicted_ms.max()) * self.config.horizon
        cost_ms = 0.0 if self._largest_move is None else \
            self._largest_move[1] * plan.queries_moved / self._largest_move[0]
        if self.config.trigger != "window" and (not plan.moves or gain_ms <= cost_ms):
            self.monitor.reset()  # (judged again once the trigger is due and the imbalance exceeds the floor)
            self._floor_ms = cost_ms if plan.moves else self._upper_bound_ms()
            log.info("re-plan after batch %d skipped: predicted gain %.1f ms over %d batches, cost %.1f ms, "
                     "%d queries to move", batch, gain_ms, self.config.horizon, cost_ms, plan.queries_moved)
            return None
        number = self.records.next_number()
        moved, move_s, narrowed, phases, flight = 0, 0.0, 0, {}, None
        note = {"moved_batch": str(batch), "moved_replan": str(number)}
        if plan.moves and (self.pool.inline or wait_moves):
            done = migrate(self.pool, self.registrar, plan.moves, note=note, revive=revive,
                           defer_release=not self.pool.inline)
            moved, move_s, narrowed, phases = done.queries, done.seconds, done.entries_narrowed, done.phases_ms
        elif plan.moves:  # batches in flight: the hand-over goes on beside them (handover_flight)
            flight = send_moves(self.pool, self.registrar, plan.moves, note)
            moved, move_s, narrowed = flight.queries, flight.send_seconds, None
        if self.config.cooldown:
            self._recent.append([q for m in plan.moves for q in m.qids])
        self.queries_moved += moved
        self.monitor.reset(plan.predicted_ms if moved else None)
        seconds = time.perf_counter() - t0
        if flight is None:  # (a move in flight: when it lands, _land)
            self._note_cost(moved, 1e3 * move_s)
        if moved:
            self._floor_ms = 0.0
        record = Replan(
            replan=number, batch=batch, asked_after_batch=asked_at, trigger=round(trigger, 4),
            busy_ms=[round(float(x), 3) for x in plan.busy_ms], measured_busy_ms=[round(float(x), 3) for x in measured],
            predicted_ms=[round(float(x), 3) for x in plan.predicted_ms], predicted_gain=round(plan.predicted_gain, 4),
            queries_moved=moved, budget=budget,
            moves=[ReplanMove(m.source, m.target, len(m.qids), round(m.predicted_ms, 3), m.unit[:200])
                   for m in plan.moves],
            seconds=round(seconds, 4), loads_seconds=round(loads_s, 4), plan_seconds=round(plan_s, 4),
            move_seconds=round(move_s, 4), move_phases_ms=phases, entries_narrowed=narrowed,
            predicted_gain_ms=round(gain_ms, 3), predicted_cost_ms=round(cost_ms, 3))
        self.replans.append(record)
        if flight is not None and moved:
            self._flight = (record, flight)
        elif moved and narrowed is None:
            self._releasing = (record, done.release)
        self.records.add(record, bool(moved))
        log.info("re-plan %d after batch %d: slowest/mean busy %.2f, %d queries moved, predicted gain %.1f %%, "
                 "%.2f s", number, batch, trigger, moved, 100 * plan.predicted_gain, record.seconds)
        return record
