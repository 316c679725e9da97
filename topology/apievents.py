"""Events, audit, health and the interruption report in the topology service's HTTP API:
``/api/v1/events``, ``/api/v1/audit``, ``/api/v1/health`` and ``/api/v1/report`` (tag
``events``).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's ledger when it has
one, read off the event loop; else its change feed's backlog; its last audit and health
documents; its hosts' signing posture). Produces: the router with those four routes (422 for a
bad time or window, 404 for an unknown host or a window no run overlaps, 503 without a readable
ledger; 503 from the health check while hosts are unprotected).
"""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response

from linkguard.ledger import LedgerError, NoRunError
from linkguard.topology.apiindex import ApiContext, FabricPort, finite
from linkguard.topology.apishapes import (
    EventsPage,
    HostQ,
    Kind,
    LimitQ,
    OffsetQ,
    Problem,
    RailQ,
    ReportTime,
    SinceQ,
    UntilQ,
)
from linkguard.topology.changes import Change

__all__ = ["events_router"]


def events_router(ctx: ApiContext) -> APIRouter:
    """The events' routes, reading ``ctx``."""
    service, index = ctx.service, ctx.index
    router = APIRouter()

    @router.get("/api/v1/events", response_model=EventsPage, tags=["events"])
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
            return JSONResponse(finite({"total": total, "events": rows}))
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

    @router.get("/api/v1/audit", response_model=dict[str, Any], tags=["events"])
    async def audit() -> Response:
        """The fleet audit document (as retained on ``service/audit``), {} before the first."""
        return Response(service.audit_json or "{}", media_type="application/json")

    @router.get(
        "/api/v1/health",
        response_model=dict[str, Any],
        responses={503: {"description": "hosts unprotected: the document plus `unprotected`"}},
        tags=["events"],
    )
    async def health() -> JSONResponse:
        """The switch-level health document (as retained on ``service/health``), {} before
        the first. 503 (the service's health check fails) while online hosts are
        unprotected (their agents drop every plan of this service: a signing mismatch,
        :mod:`~linkguard.topology.posture`): the document then also has ``status``
        (``unprotected``), ``unprotected`` (host, reason, fix each) and ``detail``."""
        unprotected = service.posture.unprotected
        if not unprotected:
            return JSONResponse(service.health_doc or {})
        hosts = sorted(unprotected)
        doc = {
            **(service.health_doc or {}),
            "status": "unprotected",
            "detail": f"{len(hosts)} host(s) drop every plan of this service (signing "
            f"mismatch), first {', '.join(hosts[:5])}: see unprotected[].fix",
            "unprotected": [
                {"host": h, "reason": unprotected[h].reason, "fix": unprotected[h].fix}
                for h in hosts
            ],
        }
        return JSONResponse(doc, status_code=503)

    @router.get(
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
        return JSONResponse(finite(rep.to_dict()))

    return router


def _event_row(change: Change, places: dict[tuple[str, str], FabricPort]) -> dict[str, Any]:
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
