"""The topology service's decisions on switch-level faults: which ``fabric/faults`` set is in
effect, which is refused and why.

Consumes: ``fabric/faults`` payloads (:class:`~linkguard.models.FabricFaults`: a complete set of
switches and cables down) and their assessed :class:`~linkguard.topology.health.Health`, with
``now`` (monotonic s) and ``wall`` (Unix s). Produces: the faults in effect (the fabric state's
health; a solve when usable rails change), the ``refused`` document of ``service/health``, and
log lines (:mod:`linkguard.topology.effects`). Pure: the assessment itself
(:meth:`FabricState.assess_faults`, CPU-bound) runs where the wiring puts it (a worker thread).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from linkguard.models import BadMessage, FabricFaults, decode
from linkguard.topology.effects import Effect, Log
from linkguard.topology.health import Health
from linkguard.topology.integrity import Refused
from linkguard.topology.schedule import head
from linkguard.topology.state import FabricState

__all__ = ["FaultsDesk"]


class FaultsDesk:
    """The faults of one service over ``state``. ``changed(now)`` schedules a solve and returns
    its effects; ``max_bytes``: the largest message taken (``bus.max_message_bytes``)."""

    def __init__(
        self, state: FabricState, *, max_bytes: int, changed: Callable[[float], list[Effect]]
    ) -> None:
        self.state = state
        self.max_bytes = max_bytes
        self._changed = changed
        #: the last accepted switch-level faults and when their health was assessed (Unix s)
        self.faults: FabricFaults | None = None
        self.health_at: float | None = None
        #: ``service/health``'s ``refused``: the last ``fabric/faults`` message refused, None
        #: once a set is accepted
        self.refused: dict[str, object] | None = None

    def read(self, topic: str, payload: bytes) -> FabricFaults | Refused | None:
        """The set a ``fabric/faults`` message carries, to assess; refused (typed reason) when
        it does not decode; None when it equals the set in effect (this service's own
        re-publish coming back)."""
        try:
            faults = decode(FabricFaults, payload, topic=topic, max_bytes=self.max_bytes)
        except BadMessage as exc:
            return Refused(exc.reason, exc.detail, reissue=False)
        return None if faults == self.faults else faults

    def accept(self, faults: FabricFaults, health: Health, now: float, wall: float) -> list[Effect]:
        """Put ``faults`` (assessed as ``health`` at ``wall``) in effect; a solve when that
        changes which rails are usable."""
        self.state.on_health(health)
        self.faults = faults
        self.health_at = wall
        fields: dict[str, Any] = {
            "switches_down": head(faults.switches_down),
            "cables_down": head(
                f"{c.a}-{c.b}" + ("" if c.count is None else f" x{c.count}")
                for c in faults.cables_down
            ),
            "reason": faults.reason,
            **health.summary(),
        }
        out: list[Effect] = [Log("info", "fabric_faults", fields)]
        if self.state.dirty:
            out += self._changed(now)
        return out

    @staticmethod
    def refusal(payload: bytes, reason: str, detail: str, wall: float) -> dict[str, object]:
        """``service/health``'s ``refused`` for a refused message at ``wall``: reason, detail
        (first 1,000 characters), at, and the payload (its JSON, else its first 2,000 bytes)."""
        return {
            "reason": reason,
            "detail": detail[:1000],
            "at": wall,
            "faults": _payload_json(payload, whole=reason != "oversized"),
        }

    def refused_log(self, reason: str) -> Log:
        """``fabric_faults_refused``: what happens to the topic (the set in effect put back)."""
        action = (
            "put the set in effect back on the topic"
            if self.faults is not None
            else "none accepted yet: running without switch-level faults"
        )
        return Log("warning", "fabric_faults_refused", {"reason": reason, "action": action})


def _payload_json(payload: bytes, *, whole: bool, limit: int = 2000) -> object:
    """A refused payload as ``service/health`` shows it: its JSON when it parses (and
    ``whole``), else its first ``limit`` bytes as text."""
    if whole:
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(payload)
    return payload[:limit].decode(errors="replace")
