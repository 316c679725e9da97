"""What the agent takes off the bus, before any decision: size limit, signature, schema.

Consumes: :class:`~linkguard.bus.BusMessage`\\ s (plans, peer routes, probe targets), the
service's public key (:mod:`linkguard.signing`; None: unverified). Produces: the decoded
message, or None after counting and logging the drop (``message_dropped``, by reason:
oversized, a :class:`~linkguard.signing.SignatureError` reason, a
:class:`~linkguard.models.BadMessage` reason) through the core's :meth:`AgentCore.drop`; a
signature refused because the two sides are configured apart (the service does not sign, or
signs with a key this agent does not have: :func:`~linkguard.signing.mismatch`) is also logged
once as ``plans_signing_mismatch`` naming the missing side. Also what the agent says of its
signing in its status (:meth:`Inbox.posture`).
"""

from __future__ import annotations

from typing import TypeVar

import structlog
from pydantic import BaseModel

from linkguard.agent.core import AgentCore
from linkguard.bus import BusMessage
from linkguard.models import BadMessage, SigningPosture, decode
from linkguard.signing import Mismatch, SignatureError, Verifier, mismatch, unwrap

__all__ = ["Inbox"]

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)


class Inbox:
    """Opens and decodes the messages of one agent (module docstring)."""

    def __init__(
        self,
        core: AgentCore,
        *,
        verifier: Verifier | None,
        require_signed: bool,
        max_bytes: int,
    ) -> None:
        """``max_bytes``: the bus's ``max_message_bytes`` (larger payloads are dropped
        before parsing); ``require_signed``: with ``verifier``, unsigned ones are dropped."""
        self.core = core
        self.verifier = verifier
        self.require_signed = require_signed
        self.max_bytes = max_bytes
        self._unverified_logged = False  # signed_plan_not_verified said once
        #: the last configuration mismatch that made this agent drop the service's plans
        #: (None: none since the last verified one); ``plans_signing_mismatch`` said once each
        self.mismatch: Mismatch | None = None
        self._mismatch_logged: set[tuple[str, str | None]] = set()

    def posture(self) -> SigningPosture:
        """What this agent says of its signing in its status (``required``: it drops unsigned
        plans; ``key_ids``: the key it verifies with)."""
        keys = [self.verifier.key_id] if self.verifier is not None else []
        return SigningPosture(required=bool(keys) and self.require_signed, key_ids=keys)

    def drop(self, msg: BusMessage, reason: str, detail: str) -> None:
        """Count and log a message that is not taken (``message_dropped``)."""
        self.core.drop(msg.topic, reason, detail, len(msg.payload))

    def decode(self, model: type[M], msg: BusMessage, host: str) -> M | None:
        """``msg`` (signed as :meth:`open` requires) validated as ``model`` for ``host``;
        None (logged, counted) when bad."""
        body = self.open(msg)
        if body is None:
            return None
        try:
            return decode(model, body, topic=msg.topic, expect_host=host, max_bytes=self.max_bytes)
        except BadMessage as exc:
            self.drop(msg, exc.reason, exc.detail)
            return None

    def open(self, msg: BusMessage) -> bytes | None:
        """The message inside ``msg.payload``: with the service's key, a signed envelope
        whose signature checks out (or, with ``require_signed_plans`` false, a plain
        message); without one, a plain message or an envelope's body (unverified, said once
        in the log). None (logged as ``message_dropped``, counted by reason) when refused."""
        size = len(msg.payload)
        if size > self.max_bytes:  # before parsing anything
            self.core.stats.messages_dropped["oversized"] += 1
            log.warning(
                "message_dropped",
                topic=msg.topic,
                reason="oversized",
                bytes=size,
                limit=self.max_bytes,
            )
            return None
        try:
            opened = unwrap(msg.payload, self.verifier, require=self.require_signed)
        except SignatureError as exc:
            self.drop(msg, exc.reason, exc.detail)
            self._mismatched(msg, exc)
            return None
        if opened.verified and self.mismatch is not None:
            log.info("plans_signing_matched", topic=msg.topic, key_id=self.verifier_key_id)
            self.mismatch = None
            self._mismatch_logged.clear()
        if opened.signed and not opened.verified and not self._unverified_logged:
            self._unverified_logged = True
            log.warning(
                "signed_plan_not_verified",
                topic=msg.topic,
                hint="the service signs its plans but this agent has no service_public_key: "
                "applied without checking the signature",
            )
        return opened.body

    @property
    def verifier_key_id(self) -> str | None:
        """The id of the key this agent verifies with (None: it has none)."""
        return self.verifier.key_id if self.verifier is not None else None

    def _mismatched(self, msg: BusMessage, exc: SignatureError) -> None:
        """A refused signature that is a configuration mismatch (:func:`mismatch`): kept, and
        logged once per reason and key as ``plans_signing_mismatch`` (an error: every plan is
        dropped, the host has no fast-path backups) naming the side that is missing."""
        found = mismatch(exc, self.verifier_key_id)
        if found is None:
            return
        self.mismatch = found
        if (found.reason, found.key_id) in self._mismatch_logged:
            return
        self._mismatch_logged.add((found.reason, found.key_id))
        log.error(
            "plans_signing_mismatch",
            host=self.core.host,
            topic=msg.topic,
            reason=found.reason,
            missing=found.missing,
            key_id=found.key_id,
            own_key_id=self.verifier_key_id,
            action="dropping every plan and peer routes message: no fast-path backups",
            hint=found.hint,
        )
