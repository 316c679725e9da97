"""The effects :class:`~linkguard.agent.core.AgentCore` returns: what the agent's wiring
(:mod:`linkguard.agent.daemon`, executors in :mod:`linkguard.agent.executor`) must do, in
list order.

Consumes nothing; produces frozen dataclasses. Each is a value: a test asserts on the exact
list. Times are wall-clock seconds (Unix) unless a name says monotonic.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkguard.models import Ack, HostStatus, Plan, PortEvent, PortState

__all__ = [
    "ApplyPlan",
    "CheckBehind",
    "Effect",
    "FastPath",
    "FlushNeighbours",
    "MarkPortUp",
    "ObserveAck",
    "ObserveEvents",
    "PersistHealth",
    "PersistHistory",
    "PersistJournal",
    "PersistPeerRoutes",
    "PersistPlan",
    "PersistTerm",
    "PublishEvent",
    "PublishState",
    "RailChange",
    "Reannounce",
    "RenderNccl",
    "RequestPlan",
    "ResendAck",
    "ScheduleTimer",
    "SendAck",
    "Yield",
]


@dataclass(frozen=True)
class ObserveEvents:
    """Count the port events in the metrics (flaps)."""

    events: tuple[PortEvent, ...]


@dataclass(frozen=True)
class ObserveAck:
    """Record the apply time of ``ack`` in the metrics (refused acks carry none)."""

    ack: Ack


@dataclass(frozen=True)
class FastPath:
    """``port`` ("hca/port") went down: mark it locally down and overlay the backup the plan
    in place has for it, at once. The executor hands the resulting ack (None: no plan, or
    no backup for the port) to :meth:`AgentCore.fast_path_applied`."""

    port: str


@dataclass(frozen=True)
class MarkPortUp:
    """``port`` is usable again (after the agent's hold-down): its fast-path overlay comes off
    the plan in place; the service's next plan re-admits it in the service's view."""

    port: str


@dataclass(frozen=True)
class ApplyPlan:
    """Put ``plan`` (accepted by the core) in place. ``same_epoch``: an expansion of the
    compact plan in hand, whose epoch may equal the applied one; ``persist_json``: write the
    plan's own JSON to the state dir; ``raw``: write this payload (as received, signature
    and all) there instead. The executor hands the ack to :meth:`AgentCore.plan_applied`."""

    plan: Plan
    same_epoch: bool = False
    persist_json: bool = False
    raw: bytes | None = None


@dataclass(frozen=True)
class SendAck:
    """Keep ``ack`` as the last one and publish it (retained) once the host is announced."""

    ack: Ack


@dataclass(frozen=True)
class ResendAck:
    """A plan of ``epoch`` arrived again and is applied already (the service re-sent it: it
    has no ack of it, :mod:`linkguard.topology.convergence`): publish the last ack again when
    it is of ``epoch`` or later and the host is announced (else the announce publishes it)."""

    epoch: int


@dataclass(frozen=True)
class RequestPlan:
    """Ask the service for this host's plan (``hosts/<host>/plan-request``, not retained):
    ``epoch`` of the plan in hand (None: none), ``reason`` (``behind``:
    :mod:`linkguard.agent.behind`), once the host is announced."""

    epoch: int | None
    reason: str


@dataclass(frozen=True)
class CheckBehind:
    """A message showed a newer version than the plan in hand: have the core's timer look
    again (:meth:`AgentCore.due`)."""


@dataclass(frozen=True)
class PublishState:
    """Publish one port state (retained), once the host is announced."""

    state: PortState


@dataclass(frozen=True)
class PublishEvent:
    """Log ``port_event`` and publish the event (not retained) once the host is announced;
    ``replay``: an event of the journal sent again (logged at debug only)."""

    event: PortEvent
    replay: bool = False


@dataclass(frozen=True)
class PersistJournal:
    """Save the event journal (``state_dir/events.json``, :mod:`linkguard.agent.journal`)."""


@dataclass(frozen=True)
class FlushNeighbours:
    """Delete the neighbour entries the last route changes left stale; may run beside the
    effects that follow (``background``: the fast path's, awaited at the end of the batch)."""

    background: bool = False


@dataclass(frozen=True)
class PersistHistory:
    """Write the monitor's flap history (``state_dir/damping.json``)."""


@dataclass(frozen=True)
class PersistHealth:
    """Write the counter-health verdicts and reference rates when they changed."""


@dataclass(frozen=True)
class PersistTerm:
    """Write ``term`` (the highest leader term seen) to ``state_dir/term``."""

    term: int


@dataclass(frozen=True)
class PersistPlan:
    """Write ``raw`` (a compact plan as received) as the last plan in the state dir."""

    raw: bytes


@dataclass(frozen=True)
class PersistPeerRoutes:
    """Write ``raw`` (peer routes as received, or re-encoded when emptied) for ``peer``."""

    peer: str
    raw: bytes


@dataclass(frozen=True)
class RenderNccl:
    """Rewrite the NCCL files from the applied plan and the port states (only what changed)."""


@dataclass(frozen=True)
class RailChange:
    """Hand what jobs see to the hooks and the rails socket when it changed (``reason``:
    start, plan, fast_path, port_event)."""

    reason: str


@dataclass(frozen=True)
class Yield:
    """Another agent with this host name started first (``other``): stop, and withdraw the
    routes on the way out (it applied another machine's plans)."""

    other: HostStatus


@dataclass(frozen=True)
class Reannounce:
    """A later duplicate published over this host: publish ``online`` again, then the
    inventory, port states and last ack (what the other published is wrong)."""


@dataclass(frozen=True)
class ScheduleTimer:
    """Call the monitor's ``tick`` at ``deadline`` (monotonic s; None: nothing pending)."""

    deadline: float | None


Effect = (
    ObserveEvents
    | ObserveAck
    | FastPath
    | MarkPortUp
    | ApplyPlan
    | SendAck
    | ResendAck
    | RequestPlan
    | CheckBehind
    | PublishState
    | PublishEvent
    | FlushNeighbours
    | PersistHistory
    | PersistJournal
    | PersistHealth
    | PersistTerm
    | PersistPlan
    | PersistPeerRoutes
    | RenderNccl
    | RailChange
    | Yield
    | Reannounce
    | ScheduleTimer
)
