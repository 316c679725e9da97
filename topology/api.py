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

The routes live in a module per concern, each an APIRouter over the same
:class:`~linkguard.topology.apiindex.ApiContext`: :mod:`~linkguard.topology.apipages` (the
dashboard), :mod:`~linkguard.topology.apifabric`, :mod:`~linkguard.topology.apiplans`,
:mod:`~linkguard.topology.apiprobes`, :mod:`~linkguard.topology.apievents`,
:mod:`~linkguard.topology.apistream` and :mod:`~linkguard.topology.apifaults`; the shapes they
answer in :mod:`~linkguard.topology.apishapes`. :func:`create_app` includes them in the order
the OpenAPI schema lists them.
"""

import asyncio
import contextlib
import errno
import socket
from collections.abc import Iterator

import structlog
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from linkguard import __version__
from linkguard.config import ApiSettings, ConfigError
from linkguard.metrics import ServiceMetrics
from linkguard.topology.apievents import events_router
from linkguard.topology.apifabric import fabric_router
from linkguard.topology.apifaults import faults_router
from linkguard.topology.apiindex import ApiContext, FabricIndex, drained_by, shown
from linkguard.topology.apipages import DASHBOARD, pages_router
from linkguard.topology.apiplans import plans_router
from linkguard.topology.apiprobes import probes_router
from linkguard.topology.apishapes import DRAINED_BY, SHOWN
from linkguard.topology.apistream import stream_router
from linkguard.topology.serviceview import ServiceView

__all__ = [
    "DASHBOARD",
    "DRAINED_BY",
    "SHOWN",
    "ApiBindError",
    "ApiServer",
    "create_app",
    "drained_by",
    "shown",
]

log = structlog.get_logger(__name__)

#: where /docs and /redoc load Swagger UI's and ReDoc's files from (package data of
#: fastapi-offline)
DOCS_ASSETS = "/docs-assets"
#: how long uvicorn lets open requests finish when the service stops (whole s: uvicorn's
#: ``timeout_graceful_shutdown`` is an int)
GRACE_S = 3


class ApiBindError(ConfigError):
    """The API's address cannot be bound (in use, not on this machine, a privileged port)."""


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
    ctx = ApiContext(service, FabricIndex(service), app.state)

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

    app.include_router(pages_router())
    app.mount("/dashboard", StaticFiles(directory=DASHBOARD, check_dir=False), name="dashboard")
    app.include_router(fabric_router(ctx))
    app.include_router(plans_router(ctx))
    app.include_router(probes_router(ctx))
    app.include_router(events_router(ctx))
    app.include_router(stream_router(ctx))
    app.include_router(faults_router(ctx))

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
