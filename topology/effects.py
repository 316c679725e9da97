"""What the topology service's core (:mod:`linkguard.topology.core`) asks its wiring to do.

Consumes: nothing (plain data). Produces: frozen dataclasses, one per kind of effect, that
:class:`~linkguard.topology.core.ServiceCore` returns from every input and the wiring module
(:mod:`linkguard.topology.service`) executes in order: publish on the bus, delete retained
messages, put this service's own plan back, feed the change feed (the ledger, the HTTP API's
stream, the dashboard), wake the solver / auditor / route-around tasks, log. Times are seconds
on the caller's monotonic clock (the ``now`` it passed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from linkguard.models import EventsConfirmed, PeerRoutes, Plan

__all__ = [
    "AnnounceOnline",
    "ClearRetained",
    "ClearStalePlans",
    "Effect",
    "Emit",
    "KickAudit",
    "KickRouteAround",
    "Log",
    "PublishConfirmed",
    "PublishPlans",
    "Reissue",
    "RetainedKind",
    "ScheduleSolve",
    "StopDuplicate",
]

#: the two retained message kinds the integrity rules guard: ``plans/<host>`` and
#: ``peers/<host>``
RetainedKind = Literal["plan", "peers"]


@dataclass(frozen=True)
class Log:
    """Log ``event`` at ``level`` (structlog's ``debug`` .. ``error``) with ``fields``."""

    level: Literal["debug", "info", "warning", "error"]
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Emit:
    """Hand ``data`` to the change feed as a change of ``kind``
    (:data:`~linkguard.topology.changes.KINDS`): the ledger writes it, the API streams it."""

    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class ScheduleSolve:
    """A change needs a solve, due at ``at`` (s; RFC 8405 back-off,
    :class:`~linkguard.topology.backoff.SolveBackoff`): wake the solver task."""

    at: float


@dataclass(frozen=True)
class KickAudit:
    """Inventories or host statuses changed: recompute the fleet audit."""


@dataclass(frozen=True)
class KickRouteAround:
    """A host status arrived: re-check which lost hosts to route around."""


@dataclass(frozen=True)
class Reissue:
    """A foreign message on ``topic`` (the ``kind`` message of ``host``): at ``at`` (s), call
    :meth:`~linkguard.topology.core.ServiceCore.reissue_due` and execute what it returns (this
    service's own message put back). One is pending per topic at a time."""

    kind: RetainedKind
    host: str
    topic: str
    at: float


@dataclass(frozen=True)
class PublishPlans:
    """Publish these plans and peer routes retained, in this order (one publisher, QoS 1:
    delivered in this order), each signed with the service's key when it has one; then tell
    the core what was sent (:meth:`~linkguard.topology.core.ServiceCore.sent`). ``why``:
    ``solve``, ``reconnect`` (the broker lost its retained messages) or ``reissue``."""

    messages: tuple[tuple[str, Plan | PeerRoutes], ...]
    why: str


@dataclass(frozen=True)
class ClearRetained:
    """Delete the retained messages on ``topics`` (a zero-length retained publish each)."""

    topics: tuple[str, ...]


@dataclass(frozen=True)
class ClearStalePlans:
    """Delete the retained plans and peer routes of hosts the fabric does not list
    (:attr:`~linkguard.topology.core.ServiceCore.stale_plans`, ``stale_peers``)."""


@dataclass(frozen=True)
class AnnounceOnline:
    """Publish this service's ``service/status`` (online), retained."""


@dataclass(frozen=True)
class StopDuplicate:
    """Another service instance that started first is on this broker: stop this one."""


@dataclass(frozen=True)
class PublishConfirmed:
    """Publish ``confirmed`` on ``confirmed/<host>`` (retained): the agent's journal forgets
    what the service recorded (:mod:`linkguard.topology.journaldesk`)."""

    confirmed: EventsConfirmed


Effect = (
    Log
    | PublishConfirmed
    | Emit
    | ScheduleSolve
    | KickAudit
    | KickRouteAround
    | Reissue
    | PublishPlans
    | ClearRetained
    | ClearStalePlans
    | AnnounceOnline
    | StopDuplicate
)
