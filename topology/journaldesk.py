"""The service's side of the agents' event journals, pure: which port events are new, which
numbers are missing for good, and what to confirm.

Each journaled :class:`~linkguard.models.PortEvent` carries its host's journal id and number
(``journal``, ``seq``), the lowest number the agent still holds (``held_from``) and the range
the agent's bounded journal dropped unconfirmed (``lost_from`` .. ``lost_to``;
:mod:`linkguard.agent.journal`). Per host this desk keeps ``upto`` (no number at or below it is
missing: taken, confirmed before, or lost) and the numbers taken above it. An event is:

- a duplicate (its number at or below ``upto``, or taken already): dropped, counted, and
  confirmed again (the agent may have missed the confirmation);
- new: emitted as a ``port_event`` change (the ledger records it with the agent's ``at``).

``held_from`` moves ``upto`` to ``held_from - 1`` at least: the agent holds nothing older, so
nothing older will come. A lost range not already below ``upto`` becomes one ``journal_gap``
change (host, journal, ``seq_from``, ``seq_to``) and a ``journal_gap`` warning: events the
journal could not keep are reported as missing, never invented. A new journal id for a host
(its state dir was wiped) starts the host again from 0.

After every journaled event the desk confirms ``upto`` (:class:`PublishConfirmed`). The state
is this service run's: a restarted service learns ``upto`` again from each agent's
``held_from``; a duplicate it can no longer tell is caught by the ledger's unique (host,
journal, seq). Events without a journal (older agents) pass through as they did.

Consumes: decoded port events. Produces: effects (:mod:`linkguard.topology.effects`). No
clock, bus or disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from linkguard.models import EventsConfirmed, PortEvent
from linkguard.topology.effects import Effect, Emit, Log, PublishConfirmed

__all__ = ["JournalDesk"]

#: numbers taken above ``upto`` kept per host at most (a host far ahead of a hole that never
#: fills: the oldest are forgotten, the ledger's unique key still holds)
AHEAD_LIMIT = 65_536


@dataclass
class _Host:
    journal: str
    upto: int = 0
    ahead: set[int] = field(default_factory=set)


class JournalDesk:
    """See the module. :attr:`duplicates`: journaled events dropped as seen, by host."""

    def __init__(self) -> None:
        self.hosts: dict[str, _Host] = {}
        self.duplicates: Counter[str] = Counter()
        self.gaps: Counter[str] = Counter()

    def on_event(self, ev: PortEvent) -> list[Effect]:
        """One port event of a fabric host: its effects."""
        if ev.seq is None or ev.journal is None:
            return [Emit("port_event", ev.model_dump(mode="json"))]
        h = self.hosts.get(ev.host)
        if h is None or h.journal != ev.journal:
            h = self.hosts[ev.host] = _Host(ev.journal)
        out: list[Effect] = []
        before = h.upto
        if ev.lost_from is not None and ev.lost_to is not None and ev.lost_to > before:
            first = max(ev.lost_from, before + 1)
            gap = {
                "host": ev.host,
                "journal": ev.journal,
                "seq_from": first,
                "seq_to": ev.lost_to,
                "events": ev.lost_to - first + 1,
                "at": ev.at,
            }
            self.gaps[ev.host] += 1
            out.append(Emit("journal_gap", gap))
            hint = "the agent's journal (journal_max_events) overflowed while unconfirmed"
            out.append(Log("warning", "journal_gap", {**gap, "hint": hint}))
            h.upto = max(h.upto, ev.lost_to)
        if ev.held_from is not None:
            h.upto = max(h.upto, ev.held_from - 1)
        if ev.seq <= before or ev.seq in h.ahead:
            self.duplicates[ev.host] += 1
            out.append(Log("debug", "port_event_duplicate", {"host": ev.host, "seq": ev.seq}))
        else:
            h.ahead.add(ev.seq)
            out.append(Emit("port_event", ev.model_dump(mode="json")))
        while h.upto + 1 in h.ahead:
            h.upto += 1
        h.ahead = {s for s in h.ahead if s > h.upto}
        if len(h.ahead) > AHEAD_LIMIT:
            h.ahead = set(sorted(h.ahead)[-AHEAD_LIMIT:])
        out.append(PublishConfirmed(EventsConfirmed(host=ev.host, journal=ev.journal, upto=h.upto)))
        return out
