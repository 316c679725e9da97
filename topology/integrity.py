"""Whether a message on a plan or peer routes topic is this service's own: the retained-message
integrity rules of the topology service.

Consumes: plan and peer routes payloads seen on the bus (retained ones read back at start, live
ones afterwards) and the payloads this service published, each with ``now`` (monotonic s).
Produces: the verified body of a retained payload, or a :class:`Refused` with its typed reason;
and when this service's own message is due back on a topic (:meth:`Integrity.foreign`,
:meth:`Integrity.reissue_due`). Pure: no bus, no clock.

With a signing key (:mod:`linkguard.signing`): a retained plan must carry this service's valid
signature; a live one must be what this service just published (the last payload on the
topic, or one of the :data:`SENT_KEPT` before it within :data:`ECHO_WINDOW_S`, compared by
BLAKE2b digest). Anything else was published by another client (forged, replayed, a
deletion): agents refuse it, but the broker would keep handing it to agents that connect, so
the service puts its own back, at most once per :data:`REISSUE_INTERVAL_S` per topic.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from linkguard.signing import SignatureError, Verifier, unwrap

__all__ = [
    "ECHO_WINDOW_S",
    "REISSUE_INTERVAL_S",
    "SENT_KEPT",
    "Integrity",
    "Refused",
    "digest",
]

#: With a signing key, digests of this many last payloads per plan / peer routes topic are
#: kept to recognise the service's own messages coming back (a few may be in flight at once)...
SENT_KEPT = 4
#: ... for this long (s) after they were published; the last one for good. An older payload
#: of this service's arriving later is a replay.
ECHO_WINDOW_S = 10.0
#: A foreign message on a plan or peer routes topic is answered with the service's own at most
#: this often per topic (s).
REISSUE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Refused:
    """A plan or peer routes message not taken. ``reason``: a
    :class:`~linkguard.signing.SignatureError` reason (``unsigned``, ``bad_envelope``,
    ``unknown_key``, ``bad_signature``, ...) or ``foreign`` (a live message another client
    published); ``detail``: for the log; ``reissue``: this service's own must be put back."""

    reason: str
    detail: str
    reissue: bool


def digest(data: bytes) -> bytes:
    """A collision-resistant digest of a published payload (BLAKE2b, 16 bytes)."""
    return hashlib.blake2b(data, digest_size=16).digest()


class Integrity:
    """The rules above for one service. ``verifier``: the service's own key's (None: plans
    are published unsigned, and nothing is checked but an envelope's shape)."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.verifier = verifier
        #: with a signing key: digests of the last payloads published on each topic, and when
        self.sent: dict[str, deque[tuple[bytes, float]]] = {}
        #: topics whose own message is due back (a :class:`~.effects.Reissue` pending)
        self.reissuing: dict[str, float] = {}
        #: when each topic's own message was last put back (s)
        self.reissued: dict[str, float] = {}

    def note_sent(self, payloads: Iterable[tuple[str, bytes]], now: float) -> None:
        """Remember what was published on plan and peer routes topics at ``now`` (with a
        signing key): the last :data:`SENT_KEPT` payloads' digests per topic."""
        if self.verifier is None:
            return
        for topic, data in payloads:
            kept = self.sent.get(topic)
            if kept is None:
                kept = self.sent[topic] = deque(maxlen=SENT_KEPT)
            kept.append((digest(data), now))

    def open_retained(self, payload: bytes) -> bytes | Refused:
        """The message inside a retained plan or peer routes payload. With a signing key it
        must carry this service's valid signature: one that does not (unsigned, another key,
        tampered) is refused and this service's own is to be put back. Without a key an
        envelope's body is read unverified (a malformed one is refused, nothing put back)."""
        try:
            return unwrap(payload, self.verifier, require=True).body
        except SignatureError as exc:
            return Refused(exc.reason, exc.detail, reissue=self.verifier is not None)

    def check_live(self, topic: str, payload: bytes, now: float) -> Refused | None:
        """A live plan or peer routes message (signing mode): None when it is this service's
        own coming back (the last it published on ``topic``, or one of the few before it
        within :data:`ECHO_WINDOW_S`, or a deletion on a topic it never published on), else
        refused as ``foreign``."""
        kept = self.sent.get(topic)
        if kept is None and not payload:
            return None  # a deletion on a topic this service never published on (its own)
        if kept:
            d = digest(payload)
            if d == kept[-1][0] or any(x == d and now - at < ECHO_WINDOW_S for x, at in kept):
                return None
        return Refused("foreign", "published on this topic by another client", reissue=True)

    def foreign(self, topic: str, now: float) -> float | None:
        """When (s) this service's own message is due back on ``topic`` after a foreign one at
        ``now``: at once, or :data:`REISSUE_INTERVAL_S` after the last put-back. None when one
        is already pending (one wait covers every foreign message meanwhile): a client that
        keeps publishing there cannot make the service publish in a loop."""
        if topic in self.reissuing:
            return None
        at = max(now, self.reissued.get(topic, -REISSUE_INTERVAL_S) + REISSUE_INTERVAL_S)
        self.reissuing[topic] = at
        return at

    def reissue_due(self, topic: str, now: float) -> None:
        """The put-back of ``topic`` starts at ``now``: the next one waits
        :data:`REISSUE_INTERVAL_S` from here. Foreign messages are still covered by it until
        :meth:`reissue_done`."""
        self.reissued[topic] = now

    def reissue_done(self, topic: str) -> None:
        """The put-back of ``topic`` is over (published, or the service stopped meanwhile)."""
        self.reissuing.pop(topic, None)
