"""The dashboard's page of the topology service's HTTP API (``GET /``; its other files are
mounted under ``/dashboard`` by :func:`~linkguard.topology.api.create_app`).

Consumes: the package's ``dashboard/`` directory. Produces: the router serving ``index.html``
(404 naming the missing file when the dashboard is not installed).
"""

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

__all__ = ["DASHBOARD", "pages_router"]

#: the dashboard's files (package data)
DASHBOARD = Path(__file__).with_name("dashboard")


def pages_router() -> APIRouter:
    """``GET /`` (not in the OpenAPI schema): the dashboard's ``index.html``."""
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        page = DASHBOARD / "index.html"
        if not page.is_file():
            raise HTTPException(404, f"the dashboard is not installed ({page} is missing)")
        return FileResponse(page, media_type="text/html")

    return router
