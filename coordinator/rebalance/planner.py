"""Which queries move where: a bounded re-plan from measured loads.

Input: each worker's measured busy time per batch over the monitor's window, ``B_w`` (ms), and
each of its queries' recent measured load ``u_q`` (:mod:`knnmon.workers.query_load`, in the
measured cost model's microseconds). A worker's movable time ``B_w - fixed`` is shared among its
queries in proportion to ``u_q``: moving the queries ``S`` from ``a`` to ``b`` is predicted to
take ``x = (B_a - fixed) * u_S / u_a`` from ``a`` and to add the same to ``b``.

Units of a move are the plan's **query sets** (queries kept together because they share
keywords and space; Tsuruoka et al. 2019, §4.2), so that a move does not scatter a set's
deliveries over two workers. Greedy, like the plan's LPT (Algorithm 2), while the budget lasts:
the slowest worker's hottest set is **spread** (moving a whole set would only move the hot spot,
which is what a stream drifting in bursts from region to region does: whole-set moves, measured,
chased it from worker to worker; docs/rebalance.md): in space order
(Z-order of the queries' positions; heaviest first when they are not given), the least busy
worker takes a run of it up to the mean busy time, then the next least busy, while that helps. A
run in space order is a compact region, so its objects reach one more worker; queries picked by
load alone lie all over the set's region, and every worker they went to received the region's
objects (docs/rebalance.md, part 3). A set spread once stays spread: a later burst in its region
lands on several workers. Queries registered at run time
(no set) form one unit per worker. CoDD (Anand & Chawathe) bounds each re-organisation's cost
the same way: a budget of moved queries per re-plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from knnmon.costs import FIXED_MS

__all__ = ["Move", "MovePlan", "plan_moves", "spatial_order"]


@dataclass(frozen=True)
class Move:
    """Queries ``qids`` move from worker ``source`` to ``target``; ``predicted_ms`` of busy time
    per batch go with them; ``unit`` says what they are (``"set 12"``, ``"set 12 (spread)"``,
    ``"registered at run time"``)."""

    qids: list[str]
    source: int
    target: int
    predicted_ms: float
    unit: str


@dataclass(frozen=True)
class MovePlan:
    """A re-plan: ``moves``; ``busy_ms`` ``(W,)`` the measured busy times it started from and
    ``predicted_ms`` ``(W,)`` after the moves (ms per batch)."""

    moves: list[Move]
    busy_ms: np.ndarray
    predicted_ms: np.ndarray

    @property
    def queries_moved(self) -> int:
        return sum(len(m.qids) for m in self.moves)

    @property
    def predicted_gain(self) -> float:
        """Predicted fall of the slowest worker's busy time, as a share of it (0..1)."""
        top = float(self.busy_ms.max()) if len(self.busy_ms) else 0.0
        return (top - float(self.predicted_ms.max())) / top if top > 0 else 0.0


@dataclass(eq=False)  # (removed from a list by identity: comparing fields compares arrays)
class _Unit:
    name: str
    qids: np.ndarray  # (n,) object: the queries' ids, heaviest first
    loads: np.ndarray  # (n,) float64 their loads
    total: float  # loads.sum(), kept (the spread looks for the hottest unit at every step)


def spatial_order(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """A Z-order (Morton) key per position, ``(n,)`` uint64 (``lon``, ``lat``: ``(n,)`` float64
    degrees, scaled to 16 bits over their own bounding box): positions near in the order are
    near in space, so a run of it is a compact region."""
    def scaled(v: np.ndarray) -> np.ndarray:
        lo, hi = (float(v.min()), float(v.max())) if len(v) else (0.0, 0.0)
        return np.floor((v - lo) / max(hi - lo, 1e-12) * 65535).astype(np.uint64)

    def spread_bits(v: np.ndarray) -> np.ndarray:
        for shift, mask in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
            v = (v | (v << np.uint64(shift))) & np.uint64(mask)
        return v

    x = scaled(np.nan_to_num(np.asarray(lon, dtype=np.float64)))
    y = scaled(np.nan_to_num(np.asarray(lat, dtype=np.float64)))
    return spread_bits(x) | (spread_bits(y) << np.uint64(1))


def _units(qids: Sequence[str], loads: np.ndarray, set_of: Mapping[str, int],
           frozen: frozenset[str] = frozenset(), where: tuple[np.ndarray, np.ndarray] | None = None) -> list[_Unit]:
    """A worker's queries grouped by their set (vectorised: a worker may hold a million
    queries), in space order within each (``where``: their ``(lon, lat)``, :func:`spatial_order`)
    or else heaviest first; ``frozen`` queries are left out."""
    if frozen:
        keep = [i for i, q in enumerate(qids) if q not in frozen]
        qids, loads = [qids[i] for i in keep], loads[keep]
        where = None if where is None else (where[0][keep], where[1][keep])
    if not len(qids):
        return []
    sets = np.fromiter((set_of.get(q, -1) for q in qids), dtype=np.int64, count=len(qids))
    order = np.lexsort((-loads if where is None else spatial_order(*where), sets))
    ids = np.asarray(qids, dtype=object)[order]
    sets, loads = sets[order], loads[order]
    cut = np.flatnonzero(np.r_[True, sets[1:] != sets[:-1], True])
    totals = np.add.reduceat(loads, cut[:-1])
    return [_Unit(f"set {sets[a]}" if sets[a] >= 0 else "registered at run time", ids[a:b], loads[a:b], float(x))
            for a, b, x in zip(cut[:-1].tolist(), cut[1:].tolist(), totals.tolist())]


def plan_moves(busy_ms: Sequence[float], queries: Sequence[tuple[Sequence[str], np.ndarray]],
               set_of: Mapping[str, int], budget: int, *, min_gain: float = 0.02,
               fixed_ms: float = FIXED_MS, max_moves: int | None = None, min_total_gain: float = 0.0,
               frozen: frozenset[str] = frozenset()) -> MovePlan:
    """A bounded re-plan (module docstring).

    Parameters
    ----------
    busy_ms
        ``(W,)`` each worker's measured busy time per batch (ms).
    queries
        Per worker: its queries' ids ``(n_w,)`` and their measured loads ``(n_w,)`` float64,
        optionally followed by their ``lon``, ``lat`` ``(n_w,)`` float64 degrees (a set is then
        spread in space order: each target takes a compact run of it, not scattered queries).
    set_of
        Query id -> its set in the plan (absent or ``-1``: none).
    budget
        Queries that may move in all, ``>= 0``.
    min_gain
        Moves stop once the slowest and the least busy worker are within this share of the
        slowest's time.
    max_moves
        Steps at most (a run of one set's queries spread until the slowest worker changes);
        default: until the budget, the gap or the movable load runs out (each step moves at
        least one query; between two equally hot workers each step is short, so a bound in
        workers would stop a re-plan early: docs/performance.md, "Re-balancing").
    min_total_gain
        No moves at all unless together they lower the slowest worker's predicted time by this
        share of it.
    frozen
        Queries that must not move (moved recently).

    Returns
    -------
    MovePlan
        Moves between the same two workers are merged.
    """
    busy = np.asarray(busy_ms, dtype=np.float64).copy()
    W = len(busy)
    before = busy.copy()
    rate = np.zeros(W)  # ms of busy time per unit of measured load, per worker
    units: list[list[_Unit]] = []
    for w, (ids, loads, *where) in enumerate(queries):
        loads = np.asarray(loads, dtype=np.float64)
        total = float(loads.sum())
        rate[w] = max(busy[w] - fixed_ms, 0.0) / total if total > 0 else 0.0
        at = (np.asarray(where[0], dtype=np.float64), np.asarray(where[1], dtype=np.float64)) if where else None
        units.append(_units(list(ids), loads, set_of, frozen, at))
    left = int(budget)
    merged: dict[tuple[int, int], tuple[list[str], list[float], list[str]]] = {}  # (a, b) -> ids, ms, units

    def record(qids: list[str], a: int, b: int, x: float, name: str) -> None:
        ids, ms, names = merged.setdefault((a, b), ([], [], []))
        ids.extend(qids)
        ms.append(x)
        if name not in names:
            names.append(name)

    for _ in range(max_moves if max_moves is not None else int(budget) + 1):
        if left <= 0 or W < 2:
            break
        a, b = int(np.argmax(busy)), int(np.argmin(busy))
        gap = busy[a] - busy[b]
        if gap <= busy[a] * min_gain or not units[a]:
            break
        # The hottest set is spread (moving it whole moves the hot spot), in its order, onto the
        # least busy workers, each taking a run of it up to the mean (in space order a run is a
        # compact region: its objects reach one more worker, not all).
        u = max(units[a], key=lambda v: v.total)
        ms = u.loads * rate[a]
        level, c, taken, seen = float(busy.mean()), int(np.argmin(busy)), 0, 0
        for j in range(len(u.qids)):
            if taken >= left:
                break
            seen = j + 1
            if ms[j] <= 0:
                continue  # (no load: nothing to gain by moving it)
            if busy[c] + ms[j] > level:
                c = int(np.argmin(busy))
            if c == a or busy[c] + ms[j] >= busy[a]:
                seen = j
                break
            busy[a] -= ms[j]
            busy[c] += ms[j]
            record([u.qids[j]], a, c, float(ms[j]), f"{u.name} (spread)")
            taken += 1
            if int(np.argmax(busy)) != a:
                break
        if not taken:
            break
        u.qids, u.loads = u.qids[seen:], u.loads[seen:]
        u.total = float(u.loads.sum())
        if not len(u.qids):
            units[a].remove(u)
        left -= taken
    if before.max() > 0 and (before.max() - busy.max()) / before.max() < min_total_gain:
        return MovePlan([], before, before.copy())  # (predicted gain below min_total_gain: nothing moves)
    moves = [Move(ids, a, b, float(sum(ms)), ", ".join(names)) for (a, b), (ids, ms, names) in merged.items()]
    return MovePlan(moves, before, busy)
