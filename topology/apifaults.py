"""The one state-changing call of the topology service's HTTP API: ``PUT /api/v1/faults``
(tag ``faults``, bearer token).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's ``api.token``, its
state's fault assessment, its bus) and the request's body, a
:class:`~linkguard.models.FabricFaults`. Produces: the router with that route: 403 without a
configured token, 401 for a missing or wrong one (checked before the body is read), 422 for a
body that does not validate or names a switch or cable the fabric lacks, 503 when the broker is
not reachable; else the faults retained on ``fabric/faults`` (``api_faults_published``).
"""

import asyncio
import hmac
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from linkguard import topics
from linkguard.models import FabricFaults, encode
from linkguard.topology.apiindex import ApiContext
from linkguard.topology.apishapes import Problem, Published

__all__ = ["faults_router"]

log = structlog.get_logger(__name__)


def inlined(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its ``$defs`` written in place: a schema put into the
    OpenAPI document by hand must not say ``#/$defs/...``, a reference the document (whose
    root has no ``$defs``) cannot resolve, and ReDoc and client generators refuse. Raises
    :class:`ValueError` for a recursive model (it cannot be inlined)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name in seen:
                    raise ValueError(f"{model.__name__}: {name} is recursive")
                return resolve(defs[name], (*seen, name))
            return {k: resolve(v, seen) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v, seen) for v in node]
        return node

    out: dict[str, Any] = resolve(schema, ())
    return out


def faults_router(ctx: ApiContext) -> APIRouter:
    """The faults' route, reading ``ctx``."""
    service = ctx.service
    bearer = HTTPBearer(auto_error=False, description="api.token of the service's settings")
    router = APIRouter()

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

    @router.put(
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
                "content": {"application/json": {"schema": inlined(FabricFaults)}},
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

    return router
