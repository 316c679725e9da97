"""Whether another client is taking this one's MQTT session over: :class:`TakeoverWatch`.

Consumes: how long each connected session lasted before the broker ended it (seconds, from the
caller's monotonic clock), and failed connection attempts. Produces: a verdict per ended
session: True when it looks like a client-id takeover.

MQTT 3.1.1 (the only version linkguard speaks, :mod:`linkguard.bus`) has no reason code for a
takeover: the broker closes the older connection when another client connects with the same
client id (MQTT 3.1.1, section 3.1.4: "If the ClientId represents a Client already connected
to the Server then the Server MUST disconnect the existing Client"), and each side reconnects
and kicks the other in turn. The signature is therefore sessions that the broker ends shortly
after they were accepted, repeatedly, while every reconnect succeeds at once (a broker that is
down refuses the reconnect instead; a restart ends one long session). Issue 21's attack kicked
the service 12 times in 15 s, so its sessions lasted ~1.2 s each. Pure: no clock, no I/O.
"""

from __future__ import annotations

__all__ = ["SHORT_SESSION_S", "TAKEOVER_REPEAT", "TakeoverWatch"]

#: a session the broker ends within this many seconds of accepting it counts as short (an
#: attacker reconnecting at any pace up to one a ten seconds is caught; a healthy session
#: lasts as long as the process)
SHORT_SESSION_S = 10.0
#: this many short sessions in a row (no failed attempt, no long session between) is a takeover
TAKEOVER_REPEAT = 2


class TakeoverWatch:
    """Counts short sessions in a row (module docstring). Not thread-safe: one caller."""

    def __init__(self, *, short_s: float = SHORT_SESSION_S, repeat: int = TAKEOVER_REPEAT):
        self.short_s = short_s
        self.repeat = repeat
        #: short sessions in a row so far
        self.streak = 0

    def session_ended(self, lasted_s: float) -> bool:
        """A connected session ended by the broker after ``lasted_s`` seconds: True when this
        makes ``repeat`` (or more) short sessions in a row, i.e. a takeover."""
        if lasted_s >= self.short_s:
            self.streak = 0
            return False
        self.streak += 1
        return self.streak >= self.repeat

    def attempt_failed(self) -> None:
        """A connection attempt failed (refused, timed out): the broker is away, not taken."""
        self.streak = 0
