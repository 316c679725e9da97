"""The fabric and its port states in the topology service's HTTP API: ``/api/v1/fabric``,
``/api/v1/summary``, ``/api/v1/ports`` and ``/api/v1/hosts/{host}`` (tag ``fabric``).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's
:class:`~linkguard.topology.state.FabricState`: port states, plans, acks, who is online, probe
suspects; the fabric index). Produces: the router with those four routes, their documents
shaped as :mod:`linkguard.topology.apishapes` declares (404 for an unknown host, 422 for a bad
filter).
"""

import json
import time
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from linkguard.models import AckResult
from linkguard.topology.apiindex import ApiContext, drained_by, hca_ref, port_view, shown
from linkguard.topology.apishapes import (
    DRAINED_BY,
    SHOWN,
    DrainedBy,
    FabricDoc,
    HostDoc,
    HostQ,
    LimitQ,
    OffsetQ,
    PortsPage,
    Problem,
    RailQ,
    Shown,
    SummaryDoc,
    SuQ,
)

__all__ = ["fabric_router"]


def fabric_router(ctx: ApiContext) -> APIRouter:
    """The fabric's routes, reading ``ctx`` (the fabric document is encoded once, cached)."""
    service, index, known_host, cached = ctx.service, ctx.index, ctx.known_host, ctx.cached
    router = APIRouter()

    @router.get("/api/v1/fabric", response_model=FabricDoc, tags=["fabric"])
    async def fabric() -> Response:
        """The fabric: rails, SUs, spines, leaves and every host's HCAs with their leaf."""
        if "fabric" not in cached:  # static for the service's life: built and encoded once
            cached["fabric"] = json.dumps(index.fabric_doc(service)).encode()
        return Response(cached["fabric"], media_type="application/json")

    @router.get("/api/v1/summary", response_model=SummaryDoc, tags=["fabric"])
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
        not_acking = service.convergence.not_acking(time.monotonic())
        return JSONResponse(
            {
                "epoch": service.state.epoch,
                "hosts": len(index.by_host),
                "online": sum(1 for h in index.by_host if online.get(h)),
                "routed_around": sorted(service.state.away),
                "not_acking": [asdict(n) for n in not_acking],
                "unprotected": [
                    {"host": h, "reason": p.reason, "fix": p.fix}
                    for h, p in sorted(service.posture.unprotected.items())
                ],
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

    @router.get(
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
                "ports": [port_view(p, st, probe_suspect=pr) for p, st, pr in page],
            }
        )

    @router.get(
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
                    **hca_ref(p),
                    "shown": shown(st, p.rate_gbps),
                    "drained_by": drained_by(st, probe_suspect=probed),
                    "state": st.model_dump(mode="json") if st is not None else None,
                }
            )
        plan = state.plans[host] if host in state.published else None
        ack = state.acks.get(host)
        late = [n for n in service.convergence.not_acking(time.monotonic()) if n.host == host]
        posture = service.posture.hosts.get(host)
        return JSONResponse(
            {
                "host": host,
                "su": index.host_su[host],
                "online": state.online.get(host),
                "routed_around": host in state.away,
                "state_write_failing": host in state.state_write_failing,
                "device_problems": state.device_problems.get(host, []),
                "hcas": views,
                "plan": plan.model_dump(mode="json") if plan is not None else None,
                "plan_epoch": state.acked_epoch(host),
                "acked_epoch": ack.epoch if ack and ack.result == AckResult.APPLIED else None,
                "not_acking": asdict(late[0]) if late else None,
                "ack": ack.model_dump(mode="json") if ack is not None else None,
                "rail_map": [a.model_dump(mode="json") for a in plan.rail_assignments]
                if plan is not None
                else [],
                "signing": {
                    "verdict": posture.verdict,
                    "reason": posture.reason,
                    "fix": posture.fix,
                    **(service.posture.said.get(host) or {}),
                }
                if posture is not None
                else None,
            }
        )

    return router
