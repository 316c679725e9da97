"""The agent's outbox, pure: publishes that must not hold up the handling of bus messages.

An ack (:class:`~linkguard.agent.effects.SendAck`, :class:`~linkguard.agent.effects.ResendAck`),
the retained status a failing state write changes, a plan request and a replayed journal event
are published at QoS 1, and a QoS 1 publish waits for the broker's PUBACK (up to the bus's
``timeout_s``, 10 s: :class:`~linkguard.bus.Bus`). Awaited where the bus messages are handled,
a lost PUBACK (or a PUBLISH lost on the way up) held back every plan and peer routes message
behind it for that long. They are put here instead, and one task of the wiring
(:mod:`linkguard.agent.daemon`, ``outbox``) publishes them in order.

Latest wins per key: a message put while an older one of the same key is still waiting
replaces it in place (an ack for epoch N is never published after one for N+1: the older is
gone, or already handed to the bus, whose PUBLISH packets go out in call order). The key of a
retained message is its topic (only the last one counts); a journal event's is its topic and
number (a replay of the same event is the same message). The wiring waits for the PUBACK of
the message in flight only while nothing else waits: its PUBLISH is in the MQTT client's queue
already, and a client's PUBLISH packets reach the broker in the order they were sent (MQTT
3.1.1 section 4.6), so a lost PUBACK holds back no later message.

Consumes: (key, topic, payload, retain) puts. Produces: the next message to publish
(:meth:`Outbox.take`). No asyncio, bus or clock.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Outbox", "Outgoing"]


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: its ``key`` (latest wins), MQTT ``topic``, ``payload`` (bytes)
    and whether it is ``retain``\\ ed."""

    key: str
    topic: str
    payload: bytes
    retain: bool


class Outbox:
    """Messages waiting to be published, in the order their keys were first put (module
    docstring). ``limit``: messages held at most (>= 1); past it the oldest is dropped and
    counted in :attr:`dropped` (journal events come back with the next re-send; an ack with
    the service's next re-send)."""

    def __init__(self, *, limit: int = 4096) -> None:
        if limit < 1:
            raise ValueError(f"outbox limit must be >= 1, got {limit}")
        self.limit = limit
        self._waiting: dict[str, Outgoing] = {}
        #: the key of the message handed out by :meth:`take` and not yet :meth:`done`
        self.in_flight: str | None = None
        #: messages replaced by a newer one of the same key before they went out
        self.replaced = 0
        #: messages dropped past ``limit``
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, key: str, topic: str, payload: bytes, *, retain: bool) -> None:
        """Wait to publish ``payload`` on ``topic``, replacing a waiting one of ``key``."""
        if key in self._waiting:
            self.replaced += 1
            self._waiting[key] = Outgoing(key, topic, payload, retain)  # keeps its place
            return
        self._waiting[key] = Outgoing(key, topic, payload, retain)
        while len(self._waiting) > self.limit:
            del self._waiting[next(iter(self._waiting))]
            self.dropped += 1

    def superseded(self) -> bool:
        """True when a newer message of the key in flight is waiting."""
        return self.in_flight is not None and self.in_flight in self._waiting

    def take(self) -> Outgoing | None:
        """The oldest waiting message (now in flight), or None."""
        if not self._waiting:
            return None
        out = self._waiting.pop(next(iter(self._waiting)))
        self.in_flight = out.key
        return out

    def done(self) -> None:
        """The message in flight was published (or given up)."""
        self.in_flight = None

    def clear(self) -> None:
        """Forget every waiting message (the agent stops: its last status goes out alone)."""
        self._waiting.clear()
