"""The plans in the topology service's HTTP API: ``/api/v1/plans`` (a page of the hosts with
a plan) and ``/api/v1/plans/{host}`` (one full plan) (tag ``plans``).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's published and full
plans, its acks). Produces: the router with those two routes (404 for an unknown host or one
without a plan yet).
"""

from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from linkguard.models import AckResult
from linkguard.topology.apiindex import ApiContext
from linkguard.topology.apishapes import LimitQ, OffsetQ, PlansPage, Problem

__all__ = ["plans_router"]


def plans_router(ctx: ApiContext) -> APIRouter:
    """The plans' routes, reading ``ctx``."""
    service, index, known_host = ctx.service, ctx.index, ctx.known_host
    router = APIRouter()

    @router.get("/api/v1/plans", response_model=PlansPage, tags=["plans"])
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

    @router.get(
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

    return router
