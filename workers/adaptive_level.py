"""The self-adaptive level of BatchSearch (Wang, Zhang, Kitsuregawa, §4.2 of the full version).

BatchSearch traverses the query R-tree for a whole batch down to a level ``L`` and estimates
each object's workload there; deeper levels estimate better but cost more (§4.1:
``ARTime(L) = ETime(L) + TETime / Efficiency(L)``, concave in ``L``). The best ``L`` depends on
the batch size and the index, so it is found online, separately for each **input-size bucket**
(here: batches of ``2**(b-1) .. 2**b - 1`` objects share bucket ``b``):

- **unstable**: successive batches of the bucket rotate round robin over ``cur``, ``cur - 1``,
  ``cur + 1`` (every batch is processed for real, at the current level or next to it); after
  ``loop`` rounds the summed response times decide: ``cur`` best of the three -> **stable**,
  else ``cur`` moves to the better neighbour and a new loop starts;
- **stable**: every batch runs at ``cur``; after ``threshold`` index updates (entries
  re-indexed) since the bucket settled, it becomes unstable again (the tree changed).

Start: ``cur = height // 2``. A neighbour outside ``0..height`` counts as infinitely slow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AdaptiveLevel"]


@dataclass
class _Bucket:
    cur: int
    stable: bool = False
    rounds: int = 0  # batches of the current loop
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # cur, cur - 1, cur + 1
    settled_at: int = 0  # the update count when it became stable
    moves: int = 0


class AdaptiveLevel:
    """Chooses BatchSearch's level per input-size bucket (module docstring).

    Parameters
    ----------
    loop
        Rounds of three batches per decision (Wang et al. used 64 and up; larger is less noisy).
    threshold
        Index updates after which a stable bucket probes again (Wang et al.: 100,000-300,000).

    Raises
    ------
    ValueError
        ``loop < 1`` or ``threshold < 1``.
    """

    OFFSETS = (0, -1, 1)

    def __init__(self, *, loop: int = 16, threshold: int = 100_000) -> None:
        if loop < 1 or threshold < 1:
            raise ValueError(f"loop and threshold must be >= 1; got {loop}, {threshold}")
        self.loop, self.threshold = int(loop), int(threshold)
        self.buckets: dict[int, _Bucket] = {}
        self.updates = 0

    @staticmethod
    def bucket_of(n_objects: int) -> int:
        """The input-size bucket of a batch of ``n_objects`` (``bit_length``)."""
        return max(int(n_objects), 0).bit_length()

    def level(self, n_objects: int, height: int) -> int:
        """The level to run a batch of ``n_objects`` at, in a tree of ``height`` node levels
        (``0..height``; ``height`` is the entries: a full first phase)."""
        b = self.buckets.get(self.bucket_of(n_objects))
        if b is None:
            b = self.buckets[self.bucket_of(n_objects)] = _Bucket(cur=height // 2)
        b.cur = min(max(b.cur, 0), height)
        if b.stable:
            if self.updates - b.settled_at >= self.threshold:
                b.stable, b.rounds, b.sums = False, 0, [0.0, 0.0, 0.0]
            else:
                return b.cur
        return min(max(b.cur + self.OFFSETS[b.rounds % 3], 0), height)

    def record(self, n_objects: int, level: int, height: int, cost: float) -> None:
        """Report the cost (mean response time, s) of a batch run at ``level`` (as
        :meth:`level` returned it for ``n_objects``)."""
        b = self.buckets.get(self.bucket_of(n_objects))
        if b is None or b.stable:
            return
        slot = b.rounds % 3
        if b.cur + self.OFFSETS[slot] != level:
            slot = None  # clipped at the tree's top or bottom: that neighbour does not exist
        if slot is not None:
            b.sums[slot] += cost
        b.rounds += 1
        if b.rounds < 3 * self.loop:
            return
        c, up, down = b.sums
        up = up if b.cur - 1 >= 0 else float("inf")
        down = down if b.cur + 1 <= height else float("inf")
        if c <= up and c <= down:
            b.stable, b.settled_at = True, self.updates
        else:
            b.cur += -1 if up < down else 1
            b.moves += 1
        b.rounds, b.sums = 0, [0.0, 0.0, 0.0]

    def updated(self, entries: int) -> None:
        """Count index updates (entries re-indexed)."""
        self.updates += int(entries)

    def state(self) -> dict[int, dict]:
        """Per bucket: ``cur``, ``stable``, ``moves`` (for reports)."""
        return {k: {"level": b.cur, "stable": b.stable, "moves": b.moves} for k, b in sorted(self.buckets.items())}
