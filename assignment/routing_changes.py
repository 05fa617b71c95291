"""The routing table's changes at run time that outlive a rebuild or a batch: the journal of
additions and narrowings a background rebuild replays, and the forwarding of a move in flight
(:class:`~knnmon.assignment.routing.RoutingTable` takes them from :class:`RunTimeChanges`)."""

from __future__ import annotations

__all__ = ["RunTimeChanges"]


class RunTimeChanges:
    """:meth:`journal`, :meth:`replay`, :meth:`forward` of a routing table (its ``add_many``,
    ``narrow``, ``_journal`` and ``forwards``)."""

    _journal: list[tuple] | None
    forwards: list[tuple[int, int]]

    def journal(self, on: bool) -> list[tuple]:
        """Start (``on``) or stop journaling :meth:`add_many`'s and :meth:`narrow`'s calls
        (``(name, arguments)``, copies); returns the journal so far and, when stopping, drops it.
        A rebuild in the background replays the calls made after its snapshot
        (:meth:`replay`, :mod:`~knnmon.coordinator.runtime.routing_upkeep`)."""
        journal = self._journal if self._journal is not None else []
        self._journal = [] if on else None
        return journal

    def replay(self, journal: list[tuple]) -> int:
        """Make the calls of a :meth:`journal` again, in order; returns how many queries' regions
        were added."""
        added = 0
        for name, args in journal:
            if name == "add_many":
                self.add_many(*args)
                added += len(args[1])
            else:
                self.narrow(*args)
        return added

    def forward(self, source: int, target: int) -> None:
        """Route to ``target`` every object routed to ``source`` until :meth:`stop_forwarding`:
        queries moved from ``source`` to ``target`` before their regions are known here (a move
        in flight, :mod:`~knnmon.coordinator.rebalance.handover_flight`) are still covered by
        ``source``'s entries, so ``target`` receives a superset of what they need."""
        self.forwards.append((int(source), int(target)))

    def stop_forwarding(self, pairs: list[tuple[int, int]]) -> None:
        """Drop the :meth:`forward` of each ``(source, target)`` of ``pairs`` (once each)."""
        for pair in pairs:
            self.forwards.remove((int(pair[0]), int(pair[1])))
