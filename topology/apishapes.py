"""The shapes of the topology service's HTTP API: the query parameters it takes and the
documents it answers (the OpenAPI schema; the handlers return the same shapes as JSON).

Consumes: nothing at run time (types only; a time in a query is read by
:func:`linkguard.ledger.parse_time`). Produces: the ``Annotated`` query parameter types (their
bounds answer 422), the pydantic response models, and the closed vocabularies the API and the
dashboard share (:data:`SHOWN`, :data:`DRAINED_BY`, the change kinds, the probe verdict kinds).
"""

from typing import Annotated, Any, Literal, get_args

from fastapi import Query
from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema

from linkguard.ledger import MAX_TIME, parse_time
from linkguard.topology.changes import KINDS

__all__ = [
    "DRAINED_BY",
    "SHOWN",
    "Cell",
    "Counts",
    "Drained",
    "DrainedBy",
    "EventRow",
    "EventsPage",
    "FabricDoc",
    "HcaRef",
    "HcaView",
    "HostDoc",
    "HostQ",
    "HostRef",
    "Kind",
    "LeafRef",
    "LimitQ",
    "NotAckingRow",
    "OffsetQ",
    "PlanRow",
    "PlansPage",
    "PortsPage",
    "ProbeKind",
    "ProbeVerdictRow",
    "ProbeVerdictsDoc",
    "Problem",
    "Published",
    "RailMapEntry",
    "RailQ",
    "ReportTime",
    "Shown",
    "SinceQ",
    "SuQ",
    "SummaryDoc",
    "SwitchRef",
    "Unprotected",
    "UntilQ",
]

Kind = Literal["port", "port_event", "journal_gap", "host", "plans", "ack", "audit", "health"]
assert get_args(Kind) == KINDS, "topology.changes.KINDS changed: update Kind"
Shown = Literal["up", "down", "held_down", "suppressed", "degraded", "unknown"]
#: the states the dashboard colours a port by, in this order (see :func:`shown`)
SHOWN: tuple[str, ...] = get_args(Shown)
DrainedBy = Literal["probe", "agent"]
#: why the service keeps a port's traffic off it while the port may be up (see
#: :func:`drained_by`), in this order
DRAINED_BY: tuple[str, ...] = get_args(DrainedBy)
ProbeKind = Literal["port", "leaf", "inconclusive"]


# -- query parameter types ---------------------------------------------------------------------


HostQ = Annotated[
    str | None, Query(min_length=1, max_length=253, description="only this host (not empty)")
]
RailQ = Annotated[int | None, Query(ge=0, le=63, description="only this rail (0..63)")]
SuQ = Annotated[int | None, Query(ge=0, le=1_000_000, description="only this scalable unit")]
LimitQ = Annotated[int, Query(ge=1, le=1000, description="page size (1..1000)")]
OffsetQ = Annotated[int, Query(ge=0, le=2**31 - 1, description="items to skip")]
#: a time in a query (events, the report's window), read as ``linkguard report --since``
#: reads it
#: (:func:`linkguard.ledger.parse_time`: 1970 .. 9999, a bare number needs >= 9 digits)
ReportTime = Annotated[
    float,
    BeforeValidator(parse_time),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": MAX_TIME},
                {"type": "string", "format": "date-time"},
            ],
            "description": "ISO 8601 (no zone: UTC) or seconds since the Unix epoch written "
            "with at least 9 digits or a decimal point; 1970-01-01 .. 9999-12-31",
        }
    ),
]
SinceQ = Annotated[ReportTime | None, Query(description="from this time on (inclusive)")]
UntilQ = Annotated[ReportTime | None, Query(description="before this time (exclusive)")]


# -- response documents (the OpenAPI schema; handlers return the same shapes as JSON) -----------


class Problem(BaseModel):
    detail: str


class SwitchRef(BaseModel):
    name: str
    su: int | None


class LeafRef(SwitchRef):
    rail: int | None


class HcaRef(BaseModel):
    hca: str
    port: int
    rail: int
    leaf: str | None = Field(description="the leaf its cable goes to (None: not cabled)")
    netdev: str | None


class HostRef(BaseModel):
    host: str
    su: int | None
    hcas: list[HcaRef]


class FabricDoc(BaseModel):
    name: str
    rails: list[int]
    sus: list[int]
    hosts_count: int
    spines: list[SwitchRef]
    leaves: list[LeafRef]
    hosts: list[HostRef]


class Counts(BaseModel):
    up: int = 0
    down: int = 0
    held_down: int = 0
    suppressed: int = 0
    degraded: int = 0
    unknown: int = 0


class Drained(BaseModel):
    probe: int = Field(0, description="ports drained by a probe verdict")
    agent: int = Field(0, description="ports their agent drained (status degraded)")


class Cell(BaseModel):
    su: int | None
    rail: int
    leaf: str | None
    hosts: int = Field(description="hosts with a port in this cell")
    counts: Counts = Field(description="ports by what the dashboard shows")
    drained: Drained = Field(description="ports by drained_by (see the ports view)")


class NotAckingRow(BaseModel):
    host: str
    epoch: int = Field(description="the epoch it owes an ack for")
    age_s: float = Field(description="since its plan (or the peer routes) went out, s")
    resends: int = Field(description="times its plan was re-sent for this epoch")


class Unprotected(BaseModel):
    host: str
    reason: str | None = Field(
        description="service_unsigned (the agent requires signed plans, the service does not "
        "sign) or unknown_key (the service signs with a key the agent does not have)"
    )
    fix: str | None = Field(description="what to change")


class SummaryDoc(BaseModel):
    epoch: int = Field(description="the last plan epoch issued")
    hosts: int
    online: int = Field(description="hosts whose agent says it is online")
    routed_around: list[str] = Field(description="hosts routed around (their last will)")
    not_acking: list[NotAckingRow] = Field(
        description="online hosts past their ack deadline (convergence.resend_after_s)"
    )
    unprotected: list[Unprotected] = Field(
        description="online hosts whose agent drops every plan of this service (signing "
        "mismatch): no fast-path backups there"
    )
    drained: Drained = Field(description="ports by drained_by, the whole fabric")
    cells: list[Cell] = Field(description="one per (SU, rail, leaf)")


class PortsPage(BaseModel):
    total: int = Field(description="ports matching the filters")
    ports: list[dict[str, Any]] = Field(
        description="PortState JSON plus shown, drained_by, su and leaf; a port without a "
        "state yet has its fabric fields, status unknown and observed_at null"
    )


class HcaView(HcaRef):
    shown: Shown
    drained_by: DrainedBy | None = Field(
        description="probe: a probe verdict drains it; agent: its agent did (status degraded)"
    )
    state: dict[str, Any] | None = Field(description="its latest PortState JSON")


class RailMapEntry(BaseModel):
    gpu: int
    endpoint: str
    hca: str
    port: int
    rail: int
    home_rail: int


class HostDoc(BaseModel):
    host: str
    su: int | None
    online: bool | None = Field(description="None: its agent never said")
    device_problems: list[str] = Field(
        default_factory=list,
        description="what its agent found wrong with its RDMA devices at start (a LAG "
        "misconfiguration: a bond member that is no bond device), one line each",
    )
    state_write_failing: bool = Field(
        False,
        description="its agent cannot write its state_dir (ENOSPC, EIO, EROFS): it routes "
        "from memory; what it would restart from is not current",
    )
    hcas: list[HcaView]
    plan: dict[str, Any] | None = Field(description="its full plan (Plan JSON, expanded)")
    plan_epoch: int | None = Field(description="the epoch it owes an ack for")
    acked_epoch: int | None = Field(description="the epoch of its last applied ack")
    not_acking: NotAckingRow | None = Field(
        description="set while it is online and past its ack deadline (its plan is re-sent)"
    )
    ack: dict[str, Any] | None = Field(description="its last Ack JSON, whatever the result")
    rail_map: list[RailMapEntry]
    signing: dict[str, Any] | None = Field(
        description="its agent's signing posture against this service: verdict (protected, "
        "unverified, unprotected, unknown), reason, fix, and what the agent said (required, "
        "key_ids); null before its first status"
    )


class PlanRow(BaseModel):
    host: str
    epoch: int = Field(description="its full plan's epoch (the one it acks)")
    acked_epoch: int | None
    compact: bool = Field(description="published as a compact plan plus shared peer routes")
    routes: int = Field(description="routes in its full plan")


class PlansPage(BaseModel):
    epoch: int
    total: int
    plans: list[PlanRow]


class ProbeVerdictRow(BaseModel):
    kind: ProbeKind = Field(description="port, leaf (both raised), inconclusive (not acted on)")
    subject: str = Field(description="host/rail<r> or a leaf's name")
    host: str | None
    rail: int | None
    hca: str | None
    port: int | None
    leaf: str | None
    su: int | None
    since: float = Field(description="raised (inconclusive: first seen so), Unix time (s)")
    age_s: float = Field(description="seconds since then")
    witnesses: int = Field(description="evidence: a port's pairs, a leaf's ports with pairs")
    lossy: int = Field(description="of those, the ones that lose (a leaf's: dark ports)")
    seen_as: list[str] = Field(description="a port verdict's rules: target, prober")
    clearing: bool = Field(description="loss has been low since clearing_since")
    clearing_since: float | None = Field(description="Unix time (s)")
    drained: bool = Field(description="a port verdict whose rail its host's plans avoid")
    reason: str | None = Field(
        description="why an inconclusive verdict is not acted on; null for port and leaf ones"
    )


class ProbeVerdictsDoc(BaseModel):
    enabled: bool = Field(description="probes.enabled of the service")
    counts: dict[ProbeKind, int] = Field(description="verdicts by kind (all kinds)")
    verdicts: list[ProbeVerdictRow] = Field(description="port, leaf, inconclusive; by subject")


class EventRow(BaseModel):
    seq: int | None = Field(None, description="change number (the change feed)")
    id: int | None = Field(None, description="row id (the ledger)")
    kind: str
    at: float = Field(description="seconds since the Unix epoch")
    host: str | None = None
    hca: str | None = None
    port: int | None = None
    rail: int | None = None
    leaf: str | None = None
    su: int | None = None
    data: Any = None


class EventsPage(BaseModel):
    total: int
    events: list[EventRow] = Field(description="newest first")


class Published(BaseModel):
    published: bool
