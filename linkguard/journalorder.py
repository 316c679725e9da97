"""The order in which a host's journaled port events reach the incident builder: its journal's
order, not the bus's.

An agent numbers its port events (:mod:`linkguard.agent.journal`); one lost on the way to the
service comes again later, replayed, after the events the agent numbered after it. Taken in
arrival order, a port's replayed ``down`` after its own later ``down -> held_down`` opened an
outage that nothing closed: ``linkguard report`` showed it open, its length the whole window
(found by the lab chaos run, issue 21; :mod:`linkguard.simulations.labchaos`). The ledger's
``port_events`` rows are written at once, in any order (they carry the agent's time and
number); only the incident builder is fed in order.

Per host and journal: the next number expected is one past the last released, raised to the
event's ``held_from`` (every lower number was confirmed or is in the lost range) and past its
lost range (``lost_to``): the journal says those will not come. An event at or below it is
released at once (a replay of what was taken, or one the journal gave up on); one above it
waits for the numbers between, and is released in order once they came, or after
:data:`HOLD_S` of the service's time (in number order: a hole that does not fill does not hold
the record back for good). A new journal id for a host starts it again.

Consumes: (host, journal, seq, held_from, lost_to) of each journaled event with the service's
time, and an opaque item to release. Produces: the items to hand on, in order. Pure: no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["HOLD_S", "JournalOrder"]

#: how long an event waits for the numbers before it (s of the service's time). An agent
#: replays what the service has not confirmed after a reconnect or a service restart, which
#: takes seconds; a hole still open after this long is one that may never fill.
HOLD_S = 60.0

T = TypeVar("T")


@dataclass
class _Host(Generic[T]):
    journal: str
    next: int
    #: seq -> (service time it arrived, item)
    waiting: dict[int, tuple[float, T]] = field(default_factory=dict)


class JournalOrder(Generic[T]):
    """See the module. ``hold_s``: :data:`HOLD_S` unless told."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self.hosts: dict[str, _Host[T]] = {}

    @property
    def waiting(self) -> int:
        """Events held back now, every host."""
        return sum(len(h.waiting) for h in self.hosts.values())

    def offer(
        self,
        host: str,
        journal: str,
        seq: int,
        item: T,
        *,
        at: float,
        held_from: int | None = None,
        lost_to: int | None = None,
    ) -> list[T]:
        """One journaled event (``at``: the service's time, s); the items to hand on now, in
        order (this one, possibly with others that waited for it, or nothing yet)."""
        h = self.hosts.get(host)
        if h is None or h.journal != journal:
            h = self.hosts[host] = _Host(journal, held_from if held_from is not None else seq)
        h.next = max(h.next, held_from or 0, (lost_to or 0) + 1)
        if seq < h.next:
            return [item, *self._drain(h)]
        h.waiting[seq] = (at, item)
        return self._drain(h)

    def expire(self, now: float) -> list[T]:
        """Items that waited :attr:`hold_s` or longer (and those after them), in order."""
        out: list[T] = []
        for h in self.hosts.values():
            if h.waiting and any(now - t >= self.hold_s for t, _ in h.waiting.values()):
                oldest = max(s for s, (t, _) in h.waiting.items() if now - t >= self.hold_s)
                for s in sorted(x for x in h.waiting if x <= oldest):
                    out.append(h.waiting.pop(s)[1])
                    h.next = s + 1
                out += self._drain(h)
        return out

    @staticmethod
    def _drain(h: _Host[T]) -> list[T]:
        out: list[T] = []
        for s in sorted(h.waiting):
            if s < h.next:
                out.append(h.waiting.pop(s)[1])
            elif s == h.next:
                out.append(h.waiting.pop(s)[1])
                h.next += 1
            else:
                break
        return out
