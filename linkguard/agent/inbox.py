"""What the agent takes off the bus, before any decision: size limit, signature, schema.

Consumes: :class:`~linkguard.bus.BusMessage`\\ s (plans, peer routes, probe targets), the
service's public key (:mod:`linkguard.signing`; None: unverified). Produces: the decoded
message, or None after counting and logging the drop (``message_dropped``, by reason:
oversized, a :class:`~linkguard.signing.SignatureError` reason, a
:class:`~linkguard.models.BadMessage` reason) through the core's :meth:`AgentCore.drop`.
"""

from __future__ import annotations

from typing import TypeVar

import structlog
from pydantic import BaseModel

from linkguard.agent.core import AgentCore
from linkguard.bus import BusMessage
from linkguard.models import BadMessage, decode
from linkguard.signing import SignatureError, Verifier, unwrap

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
            return None
        if opened.signed and not opened.verified and not self._unverified_logged:
            self._unverified_logged = True
            log.warning(
                "signed_plan_not_verified",
                topic=msg.topic,
                hint="the service signs its plans but this agent has no service_public_key: "
                "applied without checking the signature",
            )
        return opened.body
