"""Whether each host's agent takes this service's plans: its signing posture.

Consumes: what each agent says of its signing in its retained
:class:`~linkguard.models.HostStatus` (``signing``: :class:`~linkguard.models.SigningPosture`,
None from an older agent), whether it is online, and the id of this service's signing key
(:func:`linkguard.signing.key_id`; None: it publishes plans unsigned). Produces: per host a
:class:`HostPosture` (:func:`assess`), the online hosts that drop every plan of this service
(:attr:`PostureDesk.unprotected`), and the log lines to write when that set changes
(``hosts_unprotected``, an error naming the hosts and the fix; ``hosts_unprotected_cleared``).

An **unprotected** host is one whose agent drops every plan and peer routes message this
service publishes: it requires signed plans and the service does not sign
(``service_unsigned``), or it verifies with keys that are not the service's
(``unknown_key``; see :func:`linkguard.signing.unwrap`: an agent with a key verifies every
signed envelope, required or not). Such a host gets no plan, so no fast-path backups: a port
that fails there moves no traffic. **Unverified**: plans are taken without a signature check
(the agent has no key, or takes unsigned plans and the service does not sign): it works, but a
forged plan would be taken too. **Protected**: signed with a key the agent has, and it
requires signatures. **Unknown**: an agent that does not report its signing (older than this
field). Only unprotected hosts fail the service's health check and count in
``linkguard_hosts_unprotected``.

Pure: no bus, no clock, no asyncio; the core (:mod:`linkguard.topology.core`) feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from linkguard.models import HostStatus, SigningPosture
from linkguard.topology.effects import Effect, Log

__all__ = ["HostPosture", "PostureDesk", "Verdict", "assess"]

Verdict = Literal["protected", "unverified", "unprotected", "unknown"]

#: at most this many host names in one log line (the count says how many in all)
LOGGED_HOSTS = 20


@dataclass(frozen=True)
class HostPosture:
    """One host's posture against this service: ``verdict``, ``reason`` (``service_unsigned``,
    ``unknown_key``, ``agent_has_no_key``, ``unsigned_accepted``, ``not_reported``; None
    when protected) and ``fix`` (what to change, None when nothing needs to)."""

    verdict: Verdict
    reason: str | None = None
    fix: str | None = None


def assess(signing: SigningPosture | None, service_key_id: str | None) -> HostPosture:
    """The posture of an agent that says ``signing`` (None: it does not say) against a
    service that signs with ``service_key_id`` (None: unsigned). See the module docstring."""
    if signing is None:
        return HostPosture("unknown", "not_reported")
    if service_key_id is None:
        if signing.required:
            return HostPosture(
                "unprotected",
                "service_unsigned",
                "the topology service does not sign plans and this agent requires signed "
                "ones: set signing_key on the topology service (`linkguard keys generate`; "
                "its service.pub is the agents' service_public_key)",
            )
        return HostPosture(
            "unverified",
            "unsigned_accepted",
            "plans go out unsigned: set signing_key on the topology service",
        )
    if not signing.key_ids:
        return HostPosture(
            "unverified",
            "agent_has_no_key",
            f"this agent applies plans unverified: set its service_public_key to the public "
            f"key of the service's signing_key (key {service_key_id})",
        )
    if service_key_id not in signing.key_ids:
        return HostPosture(
            "unprotected",
            "unknown_key",
            f"the service signs with key {service_key_id}, this agent verifies with "
            f"{', '.join(signing.key_ids)}: set the agent's service_public_key to the public "
            "key of the service's signing_key (its service.pub), or give the service the key "
            "the agents have",
        )
    if not signing.required:
        return HostPosture(
            "unverified",
            "unsigned_accepted",
            "this agent also applies unsigned plans (require_signed_plans: false): set it "
            "true once every agent has the key",
        )
    return HostPosture("protected")


class PostureDesk:
    """The signing posture of every fabric host against this service (module docstring).
    ``service_key_id``: this service's signing key's id (None: it does not sign)."""

    def __init__(self, service_key_id: str | None) -> None:
        self.service_key_id = service_key_id
        #: per host, its posture (from its last status, online or not)
        self.hosts: dict[str, HostPosture] = {}
        #: per host, what its agent said (``required``, ``key_ids``; {}: nothing)
        self.said: dict[str, dict[str, Any]] = {}
        #: the online hosts that drop every plan of this service, with why
        self.unprotected: dict[str, HostPosture] = {}

    def on_status(self, hs: HostStatus) -> list[Effect]:
        """A fabric host's status: its posture from now on; a log line when the set of
        unprotected hosts changed (an offline host leaves it: it takes no plans anyway)."""
        posture = assess(hs.signing, self.service_key_id)
        self.hosts[hs.host] = posture
        self.said[hs.host] = hs.signing.model_dump(mode="json") if hs.signing else {}
        was = self.unprotected.get(hs.host)
        now = posture if hs.online and posture.verdict == "unprotected" else None
        if was == now:
            return []
        if now is None:
            del self.unprotected[hs.host]
            if self.unprotected:
                return []
            fields = {"host": hs.host, "online": hs.online, "verdict": posture.verdict}
            return [Log("info", "hosts_unprotected_cleared", fields)]
        self.unprotected[hs.host] = now
        return [self._unprotected_log(hs.host)]

    def _unprotected_log(self, added: str) -> Log:
        """``hosts_unprotected``: the host just added, every unprotected host (the first
        :data:`LOGGED_HOSTS`, by reason) and the fix of each reason."""
        by_reason: dict[str, list[str]] = {}
        fixes: dict[str, str] = {}
        for host in sorted(self.unprotected):
            p = self.unprotected[host]
            reason = p.reason or "?"
            by_reason.setdefault(reason, []).append(host)
            fixes.setdefault(reason, p.fix or "")
        fields = {
            "host": added,
            "reason": self.unprotected[added].reason,
            "count": len(self.unprotected),
            "hosts": {r: hs[:LOGGED_HOSTS] for r, hs in sorted(by_reason.items())},
            "service_key_id": self.service_key_id,
            "action": "these agents drop every plan of this service: no fast-path backups; "
            "the health check fails until they are fixed",
            "hint": " | ".join(f"{r}: {f}" for r, f in sorted(fixes.items())),
        }
        return Log("error", "hosts_unprotected", fields)
