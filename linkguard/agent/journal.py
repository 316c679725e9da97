"""The agent's port event journal, pure: numbering, the bound, what to replay.

Every :class:`~linkguard.models.PortEvent` the monitor produces is numbered (``seq`` 1, 2, ...
in the journal ``journal``, a random id made with the journal) and kept until the topology
service confirms it (``confirmed/<host>``, :class:`~linkguard.models.EventsConfirmed`). After a
reconnect to the broker, or when ``service/status`` shows a service that restarted, the agent
publishes every event still held again (:meth:`EventJournal.pending`): an event that went out
while nobody listened (service down) or never went out (broker down) reaches the service, with
the agent's own time of the transition (``at``). The service de-duplicates by (host, journal,
seq).

The bound: at most ``limit`` events are held. Past it the oldest unconfirmed one is dropped and
its number joins the *lost range* (``lost_from`` .. ``lost_to``): every event sent after it
carries that range, and the service records it as a ``journal_gap``; no event is invented for
it. Each sent event also carries ``held_from``, the lowest number still held, so a service that
knows nothing of this host (restarted, its confirmations gone with a broker that kept no
retained messages) can tell "confirmed long ago" from "missing".

Timed re-send (:meth:`EventJournal.resend_due`): an event still unconfirmed ``after_s`` after it
was first seen by the schedule goes again, then after twice that wait, doubling up to
``max_s`` (``journal_resend_after_s``, ``journal_resend_max_s``): an event, or its
confirmation, lost on a bus that stayed up (a PUBLISH dropped, a QoS 0 hop) reaches the service
without a reconnect. The times are the caller's (monotonic s) and are not saved.

Persistence (:meth:`EventJournal.to_doc`, :meth:`EventJournal.from_doc`) is a JSON document the
wiring writes to ``state_dir/events.json`` (format :data:`JOURNAL_VERSION`), so a restarted
agent continues the numbering and still replays what the service never confirmed.

Consumes: monitor events, confirmations, the saved document. Produces: numbered events to
publish, the document to save. No clock, bus or disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from linkguard.models import EventsConfirmed, PortEvent

__all__ = ["JOURNAL_VERSION", "EventJournal"]

#: format of ``state_dir/events.json``
JOURNAL_VERSION = 1


class EventJournal:
    """One host's journal (module docstring). ``journal``: its id (hex); ``limit``: events held
    at most (>= 1)."""

    def __init__(self, journal: str, *, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"journal limit must be >= 1, got {limit}")
        self.journal = journal
        self.limit = limit
        #: the number the next event gets
        self.next_seq = 1
        #: the highest number the service confirmed
        self.confirmed = 0
        #: events not yet confirmed, oldest first (each numbered)
        self.held: deque[PortEvent] = deque()
        #: (first, last) number dropped unconfirmed past the bound; None: none
        self.lost: tuple[int, int] | None = None
        #: events dropped past the bound since this object was made (a metric)
        self.dropped = 0
        #: events sent again by :meth:`resend_due` since this object was made (a metric)
        self.resent = 0
        self._due: dict[int, tuple[float, int]] = {}  # seq -> (next re-send at, re-sends)

    @property
    def held_from(self) -> int:
        """The lowest number still held (the next one when none is)."""
        return (self.held[0].seq or self.next_seq) if self.held else self.next_seq

    def record(self, events: Iterable[PortEvent]) -> list[PortEvent]:
        """Number ``events``, hold them (dropping the oldest past the bound into the lost
        range) and return them as sent (:meth:`_stamped`)."""
        numbered = []
        for ev in events:
            ev = ev.model_copy(update={"seq": self.next_seq, "journal": self.journal})
            self.next_seq += 1
            self.held.append(ev)
            numbered.append(ev)
        while len(self.held) > self.limit:
            gone = self.held.popleft().seq or 0
            self.lost = (self.lost[0] if self.lost else gone, gone)
            self.dropped += 1
        return [self._stamped(ev) for ev in numbered if (ev.seq or 0) >= self.held_from]

    def confirm(self, msg: EventsConfirmed) -> bool:
        """The service recorded every number up to ``msg.upto`` of ``msg.journal``: forget
        them (and a lost range below it). True when the journal changed (to be saved)."""
        if msg.journal != self.journal or msg.upto <= self.confirmed:
            return False
        self.confirmed = min(msg.upto, self.next_seq - 1)
        while self.held and (self.held[0].seq or 0) <= self.confirmed:
            self.held.popleft()
        if self.lost is not None and self.lost[1] <= self.confirmed:
            self.lost = None
        return True

    def resend_due(
        self, now: float, *, after_s: float, max_s: float
    ) -> tuple[list[PortEvent], float | None]:
        """The held events to send again at ``now`` (monotonic s), as sent, oldest first, and
        when the next one is due (None: none held). An event not yet scheduled is due
        ``after_s`` from ``now``; each re-send doubles its wait, up to ``max_s`` (s)."""
        out: list[PortEvent] = []
        due: float | None = None
        held = {ev.seq for ev in self.held}
        for seq in [s for s in self._due if s not in held]:
            del self._due[seq]  # confirmed, or dropped past the bound
        for ev in self.held:
            seq = ev.seq or 0
            at, n = self._due.get(seq, (now + after_s, 0))
            if now >= at:
                n += 1
                at = now + min(max_s, after_s * 2**n)
                out.append(self._stamped(ev))
            self._due[seq] = (at, n)
            due = at if due is None else min(due, at)
        self.resent += len(out)
        return out, due

    def pending(self) -> list[PortEvent]:
        """Every event still held, oldest first, as sent (to replay)."""
        return [self._stamped(ev) for ev in self.held]

    def _stamped(self, ev: PortEvent) -> PortEvent:
        """``ev`` with what the journal says as it goes out: ``held_from`` and the lost range."""
        lost_from, lost_to = self.lost if self.lost is not None else (None, None)
        if lost_to is not None and ev.seq is not None and lost_to >= ev.seq:
            lost_from = lost_to = None  # only an older event than the range: cannot happen
        return ev.model_copy(
            update={
                "held_from": min(self.held_from, ev.seq or self.held_from),
                "lost_from": lost_from,
                "lost_to": lost_to,
            }
        )

    # -- the saved document -------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        """The document to save (JSON-ready)."""
        return {
            "version": JOURNAL_VERSION,
            "journal": self.journal,
            "next_seq": self.next_seq,
            "confirmed": self.confirmed,
            "lost": list(self.lost) if self.lost is not None else None,
            "held": [ev.model_dump(mode="json") for ev in self.held],
        }

    @classmethod
    def from_doc(cls, doc: object, *, limit: int, host: str) -> EventJournal:
        """The journal of a saved document (:meth:`to_doc`) of ``host``, held events beyond
        ``limit`` dropped into the lost range. Raises ValueError (saying why) for a document
        that is not one: the caller starts a new journal."""
        if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION:
            raise ValueError(f"not a version {JOURNAL_VERSION} journal document")
        try:
            journal = doc["journal"]
            next_seq, confirmed = int(doc["next_seq"]), int(doc["confirmed"])
            held = [PortEvent.model_validate(x) for x in doc.get("held") or []]
            lost = doc.get("lost")
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ValueError(f"journal document: {str(exc)[:200]}") from None
        if not (isinstance(journal, str) and 8 <= len(journal) <= 32):
            raise ValueError("journal document: no journal id")
        if not next_seq >= 1 or not 0 <= confirmed < next_seq:
            raise ValueError(f"journal document: next_seq {next_seq}, confirmed {confirmed}")
        seqs = [ev.seq for ev in held]
        if any(
            ev.host != host or ev.journal != journal or s is None or not confirmed < s < next_seq
            for ev, s in zip(held, seqs, strict=True)
        ) or seqs != sorted(set(seqs)):  # type: ignore[type-var]
            raise ValueError("journal document: held events out of order or not this host's")
        if lost is not None and not (
            isinstance(lost, list)
            and len(lost) == 2
            and all(isinstance(x, int) for x in lost)
            and 1 <= lost[0] <= lost[1] < next_seq
        ):
            raise ValueError(f"journal document: bad lost range {lost!r}")
        out = cls(journal, limit=limit)
        out.next_seq, out.confirmed = next_seq, confirmed
        out.lost = (lost[0], lost[1]) if lost is not None else None
        out.held = deque(held)
        while len(out.held) > limit:
            gone = out.held.popleft().seq or 0
            out.lost = (out.lost[0] if out.lost else gone, gone)
        return out
