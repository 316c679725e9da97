"""The topology service's HTTP API (FastAPI) and the dashboard it serves.

Consumes: a running :class:`~linkguard.topology.service.TopologyService`: its fabric, its
:class:`~linkguard.topology.state.FabricState` (port states, plans, acks, epochs, who is
online), its change feed (:mod:`linkguard.topology.changes`), its last audit and health
documents and, when it has one, its ledger (``service.ledger``). Every handler is ``async``
and runs on the service's event loop, so none reads the state while the service changes it.

Produces (the contract with the dashboard; docs/api.md lists it): JSON
documents under ``/api/v1``, a server-sent-events stream of changes (``/api/v1/stream``), one
state-changing call (``PUT /api/v1/faults``, bearer token), the dashboard's files
(``topology/dashboard/``: ``/`` and ``/dashboard/{file}``), Prometheus metrics (``/metrics``,
from :mod:`linkguard.metrics`) and FastAPI's OpenAPI schema (``/openapi.json``, browsable at
``/docs`` and ``/redoc`` with their JS and CSS served from the package under ``/docs-assets``:
no request leaves for a CDN).

Bad query parameters answer 422 with FastAPI's ``detail`` (which parameter, why): an empty
``host=`` too, and a parameter given more than once (``?drained_by=agent&drained_by=probe``:
every filter takes one value); an unknown host 404 ``{"detail": ...}``. A 500 is only ever
a bug: it is logged as ``api_internal_error`` and counted in ``app.state.internal_errors``.

:class:`ApiServer` serves the app with uvicorn inside the service's event loop (the service
starts it when ``api.enabled``: :meth:`TopologyService.run
<linkguard.topology.service.TopologyService.run>`).
"""

import asyncio
import contextlib
import errno
import hmac
import json
import math
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import structlog
import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, WithJsonSchema

from linkguard import __version__, topics
from linkguard.config import ApiSettings, ConfigError
from linkguard.ledger import MAX_TIME, LedgerError, NoRunError, parse_time
from linkguard.metrics import ServiceMetrics
from linkguard.models import AckResult, FabricFaults, PortState, PortStatus, encode
from linkguard.topology.changes import KINDS, Change
from linkguard.topology.serviceview import ServiceView

__all__ = ["DRAINED_BY", "SHOWN", "ApiBindError", "ApiServer", "create_app", "drained_by", "shown"]

log = structlog.get_logger(__name__)

#: the dashboard's files (package data)
DASHBOARD = Path(__file__).with_name("dashboard")
#: where /docs and /redoc load Swagger UI's and ReDoc's files from (package data of
#: fastapi-offline)
DOCS_ASSETS = "/docs-assets"
#: a comment line on an idle stream this often (s), so proxies and clients see it alive
KEEPALIVE_S = 15.0
#: what a stream client's EventSource waits before it reconnects (ms; SSE ``retry:``)
RETRY_MS = 1000
#: how long uvicorn lets open requests finish when the service stops (whole s: uvicorn's
#: ``timeout_graceful_shutdown`` is an int)
GRACE_S = 3

Kind = Literal["port", "port_event", "host", "plans", "ack", "audit", "health"]
assert get_args(Kind) == KINDS, "topology.changes.KINDS changed: update Kind"
Shown = Literal["up", "down", "held_down", "suppressed", "degraded", "unknown"]
#: the states the dashboard colours a port by, in this order (see :func:`shown`)
SHOWN: tuple[str, ...] = get_args(Shown)
DrainedBy = Literal["probe", "agent"]
#: why the service keeps a port's traffic off it while the port may be up (see
#: :func:`drained_by`), in this order
DRAINED_BY: tuple[str, ...] = get_args(DrainedBy)
ProbeKind = Literal["port", "leaf", "inconclusive"]


def drained_by(st: PortState | None, *, probe_suspect: bool) -> str | None:
    """Why a port whose latest state is ``st`` is drained: ``probe`` when per-rail probes
    localised it as dropping packets (``probe_suspect``: its (host, rail) is in
    :attr:`FabricState.probe_suspect <linkguard.topology.state.FabricState.probe_suspect>`),
    else ``agent`` when its agent drained it (status ``degraded``: error counters over a
    threshold, or back slower; ``reason`` says which), else None."""
    if probe_suspect:
        return "probe"
    if st is not None and st.status == PortStatus.DEGRADED:
        return "agent"
    return None


def shown(st: PortState | None, link_rate_gbps: float | None = None) -> str:
    """What the dashboard shows of a port whose latest state is ``st`` (None: none yet), on a
    link the fabric rates at ``link_rate_gbps`` (Gb/s; None: unrated): ``down``,
    ``held_down``, ``suppressed`` (status suppressed, or damping says suppressed), ``degraded``
    (up and usable but below the link's rate, or a ``degraded`` status), ``up``, ``unknown``."""
    if st is None:
        return "unknown"
    status = st.status
    if status == PortStatus.DOWN:
        return "down"
    if status == PortStatus.HELD_DOWN:
        return "held_down"
    if status == PortStatus.SUPPRESSED or st.damping.suppressed:
        return "suppressed"
    if status == PortStatus.DEGRADED:
        return "degraded"
    if status == PortStatus.UP:
        if (
            st.usable
            and link_rate_gbps is not None
            and st.rate_gbps is not None
            and st.rate_gbps < link_rate_gbps
        ):
            return "degraded"
        return "up"
    return "unknown"


class ApiBindError(ConfigError):
    """The API's address cannot be bound (in use, not on this machine, a privileged port)."""


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


class SummaryDoc(BaseModel):
    epoch: int = Field(description="the last plan epoch issued")
    hosts: int
    online: int = Field(description="hosts whose agent says it is online")
    routed_around: list[str] = Field(description="hosts routed around (their last will)")
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
    hcas: list[HcaView]
    plan: dict[str, Any] | None = Field(description="its full plan (Plan JSON, expanded)")
    plan_epoch: int | None = Field(description="the epoch it owes an ack for")
    acked_epoch: int | None = Field(description="the epoch of its last applied ack")
    ack: dict[str, Any] | None = Field(description="its last Ack JSON, whatever the result")
    rail_map: list[RailMapEntry]


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


# -- the fabric, indexed once --------------------------------------------------------------------


@dataclass(frozen=True)
class _Port:
    host: str
    hca: str
    port: int
    key: str  # "hca/port", FabricState.ports' key with the host
    rail: int
    netdev: str | None
    link_layer: str | None
    leaf: str | None
    su: int | None
    rate_gbps: float | None  # the cable's rate in the fabric


class _Index:
    """Every HCA port of the fabric with its leaf, SU and cable rate, in fabric order."""

    def __init__(self, service: ServiceView) -> None:
        fabric = service.fabric
        switches = {s.name: s for s in fabric.switches}
        cable: dict[str, tuple[str, float | None]] = {}  # "host:hca/port" -> (leaf, rate)
        for link in fabric.links:
            if link.kind != "host-leaf":
                continue
            for end, other in ((link.a, link.b), (link.b, link.a)):
                if other in switches and ":" in end:
                    cable[end] = (other, link.rate_gbps)
        self.by_host: dict[str, list[_Port]] = {}
        self.host_su: dict[str, int | None] = {}
        for inv in fabric.hosts:
            leaves = [cable.get(f"{inv.host}:{h.key}", (None, None)) for h in inv.hcas]
            sus = [switches[leaf].su for leaf, _ in leaves if leaf is not None]
            host_su = next((s for s in sus if s is not None), None)
            self.host_su[inv.host] = host_su
            self.by_host[inv.host] = [
                _Port(
                    host=inv.host,
                    hca=h.hca,
                    port=h.port,
                    key=h.key,
                    rail=h.rail,
                    netdev=h.netdev,
                    link_layer=h.link_layer.value if h.link_layer else None,
                    leaf=leaf,
                    su=switches[leaf].su if leaf is not None else host_su,
                    rate_gbps=rate,
                )
                for h, (leaf, rate) in zip(inv.hcas, leaves, strict=True)
            ]
        self.ports = [p for ports in self.by_host.values() for p in ports]
        self.places = {(p.host, p.key): p for p in self.ports}

    def fabric_doc(self, service: ServiceView) -> dict[str, Any]:
        fabric = service.fabric
        leaves = [s for s in fabric.switches if s.role == "leaf"]
        return {
            "name": fabric.name,
            "rails": list(fabric.rails),
            "sus": sorted({s.su for s in leaves if s.su is not None}),
            "hosts_count": len(fabric.hosts),
            "spines": [{"name": s.name, "su": s.su} for s in fabric.switches if s.role == "spine"],
            "leaves": [{"name": s.name, "rail": s.rail, "su": s.su} for s in leaves],
            "hosts": [
                {"host": host, "su": self.host_su[host], "hcas": [_hca_ref(p) for p in ports]}
                for host, ports in self.by_host.items()
            ],
        }


def _hca_ref(p: _Port) -> dict[str, Any]:
    return {"hca": p.hca, "port": p.port, "rail": p.rail, "leaf": p.leaf, "netdev": p.netdev}


def _port_view(p: _Port, st: PortState | None, *, probe_suspect: bool) -> dict[str, Any]:
    if st is None:
        doc: dict[str, Any] = {
            "host": p.host,
            "hca": p.hca,
            "port": p.port,
            "rail": p.rail,
            "link_layer": p.link_layer,
            "netdev": p.netdev,
            "status": PortStatus.UNKNOWN.value,
            "usable": False,
            "observed_at": None,
        }
    else:
        doc = st.model_dump(mode="json")
    doc.update(
        shown=shown(st, p.rate_gbps),
        drained_by=drained_by(st, probe_suspect=probe_suspect),
        su=p.su,
        leaf=p.leaf,
    )
    return doc


def _event_row(change: Change, places: dict[tuple[str, str], _Port]) -> dict[str, Any]:
    """A change as an event row (the ledger's shape; ``leaf`` and ``su`` from the fabric)."""
    d = change.data
    host, hca, port = d.get("host"), d.get("hca"), d.get("port")
    place = places.get((host, f"{hca}/{port}")) if host and hca and port else None
    return {
        "seq": change.seq,
        "kind": change.kind,
        "at": change.at,
        "host": host,
        "hca": hca,
        "port": port,
        "rail": d.get("rail"),
        # a leaf's own events (a probe verdict on a leaf) name it
        "leaf": place.leaf if place else d.get("leaf") if isinstance(d.get("leaf"), str) else None,
        "su": place.su if place else None,
        "data": d,
    }


def _finite(value: Any) -> Any:
    """``value`` (JSON-like) with NaN and infinities as None: JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _sse(change: Change, *, with_id: bool = True) -> str:
    """One change as a server-sent event: ``id``, ``event`` (its kind), ``data`` (JSON)."""
    head = f"id: {change.seq}\n" if with_id else ""
    data = json.dumps(change.to_dict(), separators=(",", ":"))
    return f"{head}event: {change.kind}\ndata: {data}\n\n"


def _last_event_id(value: str | None, seq: int) -> int | None:
    """A client's ``Last-Event-ID`` as a change number of this service run; None when it has
    none, it is not a number, or it is above the feed's (a previous run's)."""
    if value is None or not re.fullmatch(r"[0-9]{1,19}", value.strip()):
        return None
    n = int(value.strip())
    return n if n <= seq else None


# -- the app --------------------------------------------------------------------------------------


def create_app(service: ServiceView) -> FastAPI:
    """The API of ``service`` (see the module docstring). ``app.state.closing`` (an
    asyncio.Event, set by :meth:`ApiServer.stop`) ends every open stream;
    ``app.state.internal_errors`` counts the 500s (bugs); ``app.state.metrics``: the service's
    :class:`~linkguard.metrics.ServiceMetrics` (``service.metrics`` when it has one, else made
    here: create the app before the service runs)."""

    async def one_value_each(request: Request) -> None:
        # FastAPI keeps the last of a repeated scalar parameter: refuse it instead of guessing
        counts: dict[str, int] = {}
        for name, _ in request.query_params.multi_items():
            counts[name] = counts.get(name, 0) + 1
        repeated = sorted(n for n, c in counts.items() if c > 1)
        if repeated:
            raise HTTPException(
                422,
                "query parameter(s) given more than once: "
                + ", ".join(f"{n[:64]!r} ({counts[n]} times)" for n in repeated[:8])
                + "; give each once (every filter takes one value)",
            )

    # FastAPIOffline: FastAPI with /docs (Swagger UI) and /redoc served from the package's own
    # copies of their JS and CSS under DOCS_ASSETS, not from a CDN (management networks are often
    # air-gapped); everything else as FastAPI(...)
    app = FastAPIOffline(
        static_url=DOCS_ASSETS,
        dependencies=[Depends(one_value_each)],
        title="linkguard topology service",
        version=__version__,
        description="The fabric, its port states, plans, events and changes, as the topology "
        "service sees them. Read-only but for PUT /api/v1/faults (bearer token).",
    )
    app.state.closing = asyncio.Event()
    app.state.internal_errors = 0
    # before the service runs: its histograms count from the change feed
    app.state.metrics = getattr(service, "metrics", None) or _service_metrics(service)
    index = _Index(service)
    cached: dict[str, bytes] = {}
    bearer = HTTPBearer(auto_error=False, description="api.token of the service's settings")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        app.state.internal_errors += 1
        log.error(
            "api_internal_error",
            method=request.method,
            path=request.url.path,
            error=repr(exc),
            exc_info=exc,
        )
        return JSONResponse({"detail": "internal error (logged as api_internal_error)"}, 500)

    def known_host(host: str) -> list[_Port]:
        ports = index.by_host.get(host)
        if ports is None:
            raise HTTPException(
                404, f"unknown host {host[:253]!r}: not in fabric {service.fabric.name!r}"
            )
        return ports

    # -- the dashboard ---------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        page = DASHBOARD / "index.html"
        if not page.is_file():
            raise HTTPException(404, f"the dashboard is not installed ({page} is missing)")
        return FileResponse(page, media_type="text/html")

    app.mount("/dashboard", StaticFiles(directory=DASHBOARD, check_dir=False), name="dashboard")

    # -- the fabric and its states ---------------------------------------------------------------

    @app.get("/api/v1/fabric", response_model=FabricDoc, tags=["fabric"])
    async def fabric() -> Response:
        """The fabric: rails, SUs, spines, leaves and every host's HCAs with their leaf."""
        if "fabric" not in cached:  # static for the service's life: built and encoded once
            cached["fabric"] = json.dumps(index.fabric_doc(service)).encode()
        return Response(cached["fabric"], media_type="application/json")

    @app.get("/api/v1/summary", response_model=SummaryDoc, tags=["fabric"])
    async def summary() -> JSONResponse:
        """Port counts by what the dashboard shows, per (SU, rail, leaf): the view of a big
        fabric before drilling down."""
        states, suspect = service.state.ports, service.state.probe_suspect
        Counted = tuple[set[str], dict[str, int], dict[str, int]]
        cells: dict[tuple[int | None, int, str | None], Counted] = {}
        drained = dict.fromkeys(DRAINED_BY, 0)
        for p in index.ports:
            cell = cells.get((p.su, p.rail, p.leaf))
            if cell is None:
                cell = cells[(p.su, p.rail, p.leaf)] = (
                    set(),
                    dict.fromkeys(SHOWN, 0),
                    dict.fromkeys(DRAINED_BY, 0),
                )
            cell[0].add(p.host)
            st = states.get((p.host, p.key))
            cell[1][shown(st, p.rate_gbps)] += 1
            by = drained_by(st, probe_suspect=(p.host, p.rail) in suspect)
            if by is not None:
                cell[2][by] += 1
                drained[by] += 1
        order = sorted(cells, key=lambda k: (k[0] is None, k[0] or 0, k[1], k[2] or ""))
        online = service.state.online
        return JSONResponse(
            {
                "epoch": service.state.epoch,
                "hosts": len(index.by_host),
                "online": sum(1 for h in index.by_host if online.get(h)),
                "routed_around": sorted(service.state.away),
                "drained": drained,
                "cells": [
                    {
                        "su": k[0],
                        "rail": k[1],
                        "leaf": k[2],
                        "hosts": len(cells[k][0]),
                        "counts": cells[k][1],
                        "drained": cells[k][2],
                    }
                    for k in order
                ],
            }
        )

    @app.get(
        "/api/v1/ports",
        response_model=PortsPage,
        responses={404: {"model": Problem}},
        tags=["fabric"],
    )
    async def ports(
        host: HostQ = None,
        rail: RailQ = None,
        su: SuQ = None,
        shown_: Annotated[
            Shown | None, Query(alias="shown", description="only ports shown so")
        ] = None,
        drained_by_: Annotated[
            DrainedBy | None, Query(alias="drained_by", description="only ports drained so")
        ] = None,
        limit: LimitQ = 100,
        offset: OffsetQ = 0,
    ) -> JSONResponse:
        """Port states in fabric order (host, then HCA), filtered, one page. ``drained_by``:
        ``probe`` (a probe verdict drains the port), ``agent`` (its agent did: status
        ``degraded``) or null."""
        candidates = known_host(host) if host is not None else index.ports
        states, suspect = service.state.ports, service.state.probe_suspect
        rows = []
        for p in candidates:
            if (rail is not None and p.rail != rail) or (su is not None and p.su != su):
                continue
            st = states.get((p.host, p.key))
            if shown_ is not None and shown(st, p.rate_gbps) != shown_:
                continue
            probed = (p.host, p.rail) in suspect
            if drained_by_ is not None and drained_by(st, probe_suspect=probed) != drained_by_:
                continue
            rows.append((p, st, probed))
        page = rows[offset : offset + limit]
        return JSONResponse(
            {
                "total": len(rows),
                "ports": [_port_view(p, st, probe_suspect=pr) for p, st, pr in page],
            }
        )

    @app.get(
        "/api/v1/hosts/{host}",
        response_model=HostDoc,
        responses={404: {"model": Problem}},
        tags=["fabric"],
    )
    async def host_view(host: str) -> JSONResponse:
        """One host: its HCAs and their states, its full plan, epochs and rail map."""
        hcas = known_host(host)
        state = service.state
        views = []
        for p in hcas:
            st = state.ports.get((host, p.key))
            probed = (host, p.rail) in state.probe_suspect
            views.append(
                {
                    **_hca_ref(p),
                    "shown": shown(st, p.rate_gbps),
                    "drained_by": drained_by(st, probe_suspect=probed),
                    "state": st.model_dump(mode="json") if st is not None else None,
                }
            )
        plan = state.plans[host] if host in state.published else None
        ack = state.acks.get(host)
        return JSONResponse(
            {
                "host": host,
                "su": index.host_su[host],
                "online": state.online.get(host),
                "routed_around": host in state.away,
                "hcas": views,
                "plan": plan.model_dump(mode="json") if plan is not None else None,
                "plan_epoch": state.acked_epoch(host),
                "acked_epoch": ack.epoch if ack and ack.result == AckResult.APPLIED else None,
                "ack": ack.model_dump(mode="json") if ack is not None else None,
                "rail_map": [a.model_dump(mode="json") for a in plan.rail_assignments]
                if plan is not None
                else [],
            }
        )

    # -- plans -----------------------------------------------------------------------------------

    @app.get("/api/v1/plans", response_model=PlansPage, tags=["plans"])
    async def plans(limit: LimitQ = 100, offset: OffsetQ = 0) -> JSONResponse:
        """The hosts with a plan, in fabric order, one page: epochs, compact or not, routes."""
        state = service.state
        hosts = [h for h in index.by_host if h in state.published]
        rows = []
        for h in hosts[offset : offset + limit]:
            full = state.plans[h]
            ack = state.acks.get(h)
            rows.append(
                {
                    "host": h,
                    "epoch": full.epoch,
                    "acked_epoch": ack.epoch if ack and ack.result == AckResult.APPLIED else None,
                    "compact": state.published[h].shared is not None,
                    "routes": len(full.routes),
                }
            )
        return JSONResponse({"epoch": state.epoch, "total": len(hosts), "plans": rows})

    @app.get(
        "/api/v1/plans/{host}",
        response_model=dict[str, Any],
        responses={404: {"model": Problem}},
        tags=["plans"],
    )
    async def plan(host: str) -> JSONResponse:
        """The host's full plan (Plan JSON; a compact plan expanded with the peer routes)."""
        known_host(host)
        if host not in service.state.published:
            raise HTTPException(404, f"host {host!r} has no plan yet")
        return JSONResponse(service.state.plans[host].model_dump(mode="json"))

    # -- probes ----------------------------------------------------------------------------------

    @app.get("/api/v1/probes/verdicts", response_model=ProbeVerdictsDoc, tags=["probes"])
    async def probe_verdicts(
        kind: Annotated[ProbeKind | None, Query(description="only this kind")] = None,
        host: HostQ = None,
    ) -> JSONResponse:
        """The per-rail probe verdicts in force: raised ``port`` verdicts (their rail drained
        for their host), raised ``leaf`` verdicts (logged only: switch-level faults are the
        operator's ``fabric/faults``) and the ``inconclusive`` ones of the last localisation
        (never acted on), with where, since when and their evidence counts
        (:meth:`~linkguard.topology.service.TopologyService.probe_verdicts`). ``counts`` is
        over all verdicts, whatever the filters; empty with probes off. 404 for an unknown
        ``host``."""
        if host is not None:
            known_host(host)
        rows = service.probe_verdicts()
        counts = dict.fromkeys(get_args(ProbeKind), 0)
        for r in rows:
            counts[str(r["kind"])] += 1
        shown_rows = [
            {**r, "reason": r.get("reason") or None}  # no reason: null, not ""
            for r in rows
            if (kind is None or r["kind"] == kind) and (host is None or r["host"] == host)
        ]
        return JSONResponse(
            _finite(
                {
                    "enabled": service.settings.probes.enabled,
                    "counts": counts,
                    "verdicts": shown_rows,
                }
            )
        )

    # -- events, audit, health, report -----------------------------------------------------------

    @app.get("/api/v1/events", response_model=EventsPage, tags=["events"])
    async def events(
        host: HostQ = None,
        rail: RailQ = None,
        kind: Annotated[Kind | None, Query(description="only this kind")] = None,
        since: SinceQ = None,
        until: UntilQ = None,
        limit: LimitQ = 100,
        offset: OffsetQ = 0,
    ) -> JSONResponse:
        """Events, newest first: from the ledger when the service has one, else from the
        change feed's backlog (this run's last changes)."""
        if since is not None and until is not None and since > until:
            raise HTTPException(422, f"since ({since:g}) is after until ({until:g})")
        if host is not None and host not in service.state.host_names:
            raise HTTPException(404, f"host {host!r} is not in fabric {service.fabric.name!r}")
        ledger = getattr(service, "ledger", None)
        if ledger is not None:  # a read connection of its own: off the service's loop
            try:
                total, rows = await asyncio.to_thread(
                    ledger.events,
                    host=host,
                    rail=rail,
                    kind=kind,
                    since=since,
                    until=until,
                    limit=limit,
                    offset=offset,
                )
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
            except LedgerError as exc:
                raise HTTPException(503, str(exc)) from None
            return JSONResponse(_finite({"total": total, "events": rows}))
        found = [
            c
            for c in reversed(service.changes.backlog())
            if (kind is None or c.kind == kind)
            and (host is None or c.data.get("host") == host)
            and (rail is None or c.data.get("rail") == rail)
            and (since is None or c.at >= since)
            and (until is None or c.at < until)
        ]
        return JSONResponse(
            {
                "total": len(found),
                "events": [_event_row(c, index.places) for c in found[offset : offset + limit]],
            }
        )

    @app.get("/api/v1/audit", response_model=dict[str, Any], tags=["events"])
    async def audit() -> Response:
        """The fleet audit document (as retained on ``service/audit``), {} before the first."""
        return Response(service.audit_json or "{}", media_type="application/json")

    @app.get("/api/v1/health", response_model=dict[str, Any], tags=["events"])
    async def health() -> JSONResponse:
        """The switch-level health document (as retained on ``service/health``), {} before
        the first."""
        return JSONResponse(service.health_doc or {})

    @app.get(
        "/api/v1/report",
        response_model=dict[str, Any],
        responses={503: {"model": Problem}},
        tags=["events"],
    )
    async def report(
        price_per_gpu_hour: Annotated[
            float, Query(ge=0, le=1_000_000, description="$ per GPU-hour, for GPU-hours saved")
        ] = 2.0,
        since: Annotated[ReportTime | None, Query(description="window start")] = None,
        until: Annotated[ReportTime | None, Query(description="window end (exclusive)")] = None,
    ) -> JSONResponse:
        """The ledger's interruption report (JSON form, ``linkguard report --format json``),
        its window clamped to what the ledger recorded; 422 for a bad time, 503 without a
        ledger or with an unreadable one, 404 when no run overlaps the window."""
        ledger = getattr(service, "ledger", None)
        if ledger is None:
            raise HTTPException(503, "no ledger configured")
        if since is not None and until is not None and since >= until:
            raise HTTPException(422, f"since ({since:g}) is not before until ({until:g})")
        try:
            rep = await asyncio.to_thread(
                ledger.report, price_per_gpu_hour=price_per_gpu_hour, since=since, until=until
            )
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        except NoRunError as exc:  # nothing recorded in the window
            raise HTTPException(404, str(exc)) from None
        except LedgerError as exc:  # unreadable
            raise HTTPException(503, str(exc)) from None
        return JSONResponse(_finite(rep.to_dict()))

    # -- the stream ------------------------------------------------------------------------------

    @app.get(
        "/api/v1/stream",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
        tags=["events"],
    )
    async def stream(
        last_event_id: Annotated[
            str | None,
            Header(
                alias="Last-Event-ID",
                description="the id of the last change seen: the stream replays what came "
                "after it, or starts with a resync event when those are gone",
            ),
        ] = None,
    ) -> StreamingResponse:
        """Changes as server-sent events: ``id: <seq>``, ``event: <kind>``, ``data: {seq,
        kind, at, data}``; a ``: keepalive`` comment every 15 s; ``resync`` (reload) when
        changes were lost. Ends when the service stops."""
        return StreamingResponse(
            _changes(last_event_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _changes(last_event_id: str | None) -> AsyncIterator[str]:
        feed = service.changes
        closing: asyncio.Event = app.state.closing
        with feed.listen() as queue:  # first: nothing emitted from here on is missed
            head = feed.seq
            yield f"retry: {RETRY_MS}\n: linkguard changes, seq {head}\n\n"
            resume = _last_event_id(last_event_id, head)
            sent = head
            if last_event_id is not None:
                missed = feed.since(resume) if resume is not None else None
                if missed is None:
                    lost = {"reason": "the changes after Last-Event-ID are gone", "seq": head}
                    yield _sse(Change(head, "resync", time.time(), lost))
                else:
                    for c in missed:
                        yield _sse(c)
            async for item in _next(queue, closing):
                if item is None:
                    yield ": keepalive\n\n"
                elif item.kind == "resync":  # the queue overflowed; no id: a reconnect replays
                    yield _sse(item, with_id=False)
                elif item.seq > sent:
                    yield _sse(item)

    # -- changing state --------------------------------------------------------------------------

    async def require_token(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        token = service.settings.api.token
        if token is None:
            raise HTTPException(
                403,
                "no token configured: set api.token (LINKGUARD_API__TOKEN) to allow "
                "state-changing calls",
            )
        if creds is None:
            raise HTTPException(
                401,
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(creds.credentials.encode(), token.get_secret_value().encode()):
            raise HTTPException(401, "wrong token", headers={"WWW-Authenticate": "Bearer"})

    @app.put(
        "/api/v1/faults",
        status_code=202,
        response_model=Published,
        responses={
            401: {"model": Problem},
            403: {"model": Problem},
            422: {"description": "a bad body, or a switch or cable the fabric lacks"},
            503: {"model": Problem},
        },
        dependencies=[Depends(require_token)],
        tags=["faults"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": FabricFaults.model_json_schema()}},
            }
        },
    )
    async def put_faults(request: Request) -> dict[str, bool]:
        """Publish the body, a :class:`~linkguard.models.FabricFaults` (the complete set of
        switches and cables down), retained on ``fabric/faults``, as ``linkguard fabric
        faults`` would. The token is checked before the body is read (401/403 say nothing
        about a body); then a body that does not validate is 422, and it is checked against
        the fabric (422 naming an unknown switch or cable; nothing published); 503 when the
        broker is not reachable."""
        try:
            faults = FabricFaults.model_validate_json(await request.body())
        except ValidationError as exc:
            raise HTTPException(
                422,
                [
                    {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                    for e in exc.errors()[:10]
                ],
            ) from None
        try:
            await asyncio.to_thread(service.state.assess_faults, faults)
        except ValueError as exc:
            raise HTTPException(422, f"{exc}; nothing published") from None
        if not await service.bus.publish(topics.fabric_faults(), encode(faults), retain=True):
            raise HTTPException(503, "the MQTT broker is not reachable: nothing published")
        log.info(
            "api_faults_published",
            switches_down=len(faults.switches_down),
            cables_down=len(faults.cables_down),
            reason=faults.reason,
        )
        return {"published": True}

    # -- metrics ---------------------------------------------------------------------------------

    async def metrics(request: Request) -> Response:
        """Prometheus text (or OpenMetrics, by ``Accept``) from :mod:`linkguard.metrics`."""
        if app.state.metrics is None:
            raise HTTPException(503, "metrics are not available in this build")
        body, content_type = app.state.metrics.render(request.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})

    for path in ("/metrics", "/metrics/"):  # both: no redirect from one to the other
        app.add_api_route(path, metrics, methods=["GET"], include_in_schema=path == "/metrics")

    return app


def _service_metrics(service: ServiceView) -> ServiceMetrics:
    """:class:`linkguard.metrics.ServiceMetrics` of ``service``."""
    return ServiceMetrics(service)


async def _next(
    queue: asyncio.Queue[Change], closing: asyncio.Event
) -> AsyncIterator[Change | None]:
    """The queue's changes, None after each :data:`KEEPALIVE_S` without one; ends once
    ``closing`` is set. Nothing is lost on the way out: a change taken is yielded."""
    stop = asyncio.ensure_future(closing.wait())
    get: asyncio.Future[Change] | None = None
    try:
        while not closing.is_set():
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, stop}, timeout=KEEPALIVE_S, return_when="FIRST_COMPLETED")
            if get.done():
                item = get.result()
                get = None
                yield item
            elif not stop.done():
                yield None
    finally:
        stop.cancel()
        if get is not None:
            get.cancel()  # an item it had not taken stays in the queue


# -- serving -------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the service owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """:func:`create_app` of ``service`` served by uvicorn on the running event loop.

    :meth:`bind` (raises :class:`ApiBindError`), then ``await serve()`` (a task), then
    :meth:`shutdown`: open streams end, requests get :data:`GRACE_S` to finish."""

    def __init__(self, service: ServiceView, settings: ApiSettings) -> None:
        self.settings = settings
        self.app = create_app(service)
        self.port: int | None = None
        self._sock: socket.socket | None = None
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the process's logging (structlog) stays as configured
            access_log=False,
            lifespan="off",
            ws="none",
            server_header=False,
            timeout_graceful_shutdown=GRACE_S,
        )
        self._server = _Server(config)

    @property
    def url(self) -> str:
        host = self.settings.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def bind(self) -> int:
        """Bind and listen on ``settings.host:settings.port`` (port 0: a free one); the bound
        port, logged as ``api_listening``. Raises :class:`ApiBindError` naming the address."""
        host, port = self.settings.host, self.settings.port
        where = f"{host}:{port}"
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise ApiBindError(f"cannot serve the HTTP API on {where}: {exc}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            hint = {
                errno.EADDRINUSE: "the port is in use (another topology service?): set "
                "api.port (LINKGUARD_API__PORT; 0 = any free port) or api.enabled: false",
                errno.EADDRNOTAVAIL: "the address is not one of this machine's: set api.host",
                errno.EACCES: "ports below 1024 need privileges: set api.port",
            }.get(exc.errno or 0, "see api.host and api.port")
            raise ApiBindError(
                f"cannot serve the HTTP API on {where}: {exc.strerror or exc}; {hint}"
            ) from None
        self._sock = sock
        self.port = sock.getsockname()[1]
        log.info("api_listening", url=self.url)
        return self.port

    async def serve(self) -> None:
        """Serve until :meth:`stop` (binds first when :meth:`bind` was not called)."""
        if self._sock is None:
            self.bind()
        sock = self._sock
        assert sock is not None  # bind() set it (or raised)
        try:
            await self._server.serve(sockets=[sock])
        finally:
            self.close()

    def stop(self) -> None:
        """End every open stream and let uvicorn stop (it finishes within :data:`GRACE_S`)."""
        self.app.state.closing.set()
        self._server.should_exit = True

    async def shutdown(self, task: asyncio.Task[None]) -> None:
        """:meth:`stop`, then wait for ``task`` (the one running :meth:`serve`) to end;
        cancelled after :data:`GRACE_S` + 2 s."""
        self.stop()
        if not task.done():
            await asyncio.wait([task], timeout=GRACE_S + 2)
        task.cancel()
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
