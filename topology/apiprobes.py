"""The per-rail probe verdicts in the topology service's HTTP API:
``/api/v1/probes/verdicts`` (tag ``probes``).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's
``probe_verdicts()`` and ``probes.enabled``). Produces: the router with that route (counts by
kind over all verdicts, the rows filtered by kind and host; 404 for an unknown host; NaN and
infinities as null).
"""

from typing import Annotated, get_args

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from linkguard.topology.apiindex import ApiContext, finite
from linkguard.topology.apishapes import HostQ, ProbeKind, ProbeVerdictsDoc

__all__ = ["probes_router"]


def probes_router(ctx: ApiContext) -> APIRouter:
    """The probes' route, reading ``ctx``."""
    service, known_host = ctx.service, ctx.known_host
    router = APIRouter()

    @router.get("/api/v1/probes/verdicts", response_model=ProbeVerdictsDoc, tags=["probes"])
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
            finite(
                {
                    "enabled": service.settings.probes.enabled,
                    "counts": counts,
                    "verdicts": shown_rows,
                }
            )
        )

    return router
