"""The topology service's wiring module: the only place that creates its tasks and executes the
effects of its core (:class:`~linkguard.topology.core.ServiceCore`).

Channels (``producer -> consumer``)::

    bus task -> core                every message (core.on_message), fabric/faults -> io
    core -> solver task             ScheduleSolve: _kick (an Event), due time in core.backoff
    core -> auditor task            KickAudit: _audit_kick
    core -> route_around task       KickRouteAround: _offline_kick
    core -> reissue:<topic> task    Reissue: this service's own plan put back at its time
    solver / prober -> io -> bus    plans, peer routes, probe targets (retained, signed)
    io -> resender task             what the broker did not take: io.unsent, _resend_kick
    core -> convergence task        hosts that do not ack: re-sent at the times core.converge says
    core / io -> changes            Emit: the change feed -> ledger, HTTP API stream
    leader task -> solver, auditor  _won: this service leads (at once without election)

One TaskGroup, its tasks named: ``bus``, ``solver`` (waits for a change, waits as the RFC 8405
back-off says (:mod:`linkguard.topology.backoff`), solves off the event loop, publishes),
``auditor`` (the fleet audit, retained on ``service/audit``), ``route_around``, ``resender``,
``convergence`` (plans re-sent to online hosts that do not ack:
:mod:`~linkguard.topology.convergence`),
``leader`` (:mod:`linkguard.topology.leader`), ``stop``, ``prober`` (with ``probes.enabled``),
``api`` (with ``api.enabled``: :mod:`linkguard.topology.api`, bound before the bus connects);
and one ``reissue:<topic>`` task per foreign message being answered. What is published and
how (signing, windows, re-sends, fabric faults, health, stale plans, probes, the solve loop)
is the executors' (:mod:`~linkguard.topology.serviceio`, :mod:`~linkguard.topology.faultsio`,
:mod:`~linkguard.topology.scheduleio`, :mod:`~linkguard.topology.probesio`); what to do about
each message is the core's.

With ``leader.etcd`` or ``leader.kubernetes`` several services run for one fabric: each
connects and reads the bus (a warm standby), every publish passes the leadership fence, and
only the lease holder solves and publishes, stamping its term on every plan. A leader that
loses the lease stops publishing at once and :meth:`TopologyService.run` raises
:class:`~linkguard.topology.leader.LeadershipLostError`; a clean stop revokes the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from linkguard import topics
from linkguard.bus import Bus, BusMessage, BusSession, Will
from linkguard.buslife import BusLife
from linkguard.config import ServiceSettings
from linkguard.ledger import Ledger
from linkguard.models import encode
from linkguard.presence import DuplicateInstanceError, Me
from linkguard.settings.discoversection import FabricDiscovery
from linkguard.signing import Signer
from linkguard.stopdeadline import on_stop_signals
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.core import DECODERS, ServiceCore
from linkguard.topology.discover import Discovery
from linkguard.topology.discoverdesk import DiscoveryDesk
from linkguard.topology.discoverio import load_discovery
from linkguard.topology.effects import (
    Effect,
    Emit,
    KickAudit,
    KickRouteAround,
    Log,
    Reissue,
    ScheduleSolve,
    StopDuplicate,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.leader import FencedBus, leadership_from_settings
from linkguard.topology.probesio import ProbesIO
from linkguard.topology.scheduleio import ScheduleIO
from linkguard.topology.serviceio import ServiceIO, fabric_from_settings

if TYPE_CHECKING:
    from linkguard.topology.api import ApiServer

__all__ = ["TopologyService", "fabric_from_settings", "run_discovered", "run_service"]

log = structlog.get_logger(__name__)


class TopologyService(ScheduleIO, ProbesIO):
    """``await service.run()`` until cancelled or :meth:`stop`."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        fabric: Fabric | None = None,
        bus_factory: Callable[..., BusSession] = Bus,
        expected: Fabric | None = None,
        discovered: Discovery | None = None,
        on_discovery: Callable[[BusMessage], Awaitable[None]] | None = None,
    ) -> None:
        """``bus_factory`` makes the bus session (takes :class:`~linkguard.bus.Bus`'s keyword
        arguments); simulations pass an in-memory bus. ``expected`` and ``discovered`` (with
        ``fabric: {discover: ...}``): the fleet audit compares the expected fabric with the
        discovered one. Raises KeyFileError (a ConfigError) for a ``signing_key`` file that
        cannot be used, e.g. mode 0644. ``on_discovery``: takes every ``hosts/<host>/discovery``
        message (:func:`run_discovered`'s desk)."""
        self.settings = settings
        self.on_discovery = on_discovery
        self.audit_expected = expected
        self.discovered = discovered
        self.signer = Signer.from_file(settings.signing_key) if settings.signing_key else None
        self.fabric = fabric if fabric is not None else fabric_from_settings(settings)
        self.me = Me()
        #: who steers (:mod:`linkguard.topology.leader`): with an election configured this
        #: service is a warm standby until it holds the lease
        self.leadership = leadership_from_settings(
            settings.leader,
            fabric=self.fabric.name,
            identity=f"{socket.gethostname()}/{self.me.instance}",
        )
        self.core = ServiceCore(
            settings,
            self.fabric,
            verifier=self.signer.verifier if self.signer is not None else None,
            me=self.me,
            elected=self.leadership.elected,
            epoch_start=int(time.time() * 1000),
        )
        #: every accepted change, for the ledger, the API's stream and the dashboard
        self.changes = ChangeFeed()
        self.ledger: Ledger | None = self._open_ledger()
        #: the HTTP API's server and bound port while it is served (``api`` settings)
        self.api: ApiServer | None = None
        self.api_port: int | None = None
        self._audit_kick = asyncio.Event()  # core -> auditor
        self._offline_kick = asyncio.Event()  # core -> route_around
        self._kick = asyncio.Event()  # core -> solver
        self._resend_kick = asyncio.Event()  # io -> resender
        self._won = asyncio.Event()  # leader -> solver, auditor, prober
        self._stop = asyncio.Event()
        self._started = time.monotonic()
        self._first_connect: float | None = None
        self._reissuing: dict[str, asyncio.Task[None]] = {}  # core -> reissue:<topic>
        ServiceIO.__init__(self)
        self.bus: BusSession = bus_factory(
            **settings.bus.connection(),
            client_id=f"linkguard-topology-{self.me.instance}",
            subscriptions=[
                topics.all_host_topics(),
                topics.all_plans(),
                topics.all_peer_routes(),
                topics.service_status(),
                # before fabric/faults: its retained document arrives before the retained set
                topics.service_health(),
                topics.fabric_faults(),
            ],
            on_connect=self._on_connect,
            will=Will(topics.service_status(), encode(self._status(online=False))),
        )
        if self.leadership.elected:  # every publish behind the leadership fence
            self.bus = FencedBus(self.bus, self.leadership)

    @property
    def term(self) -> int | None:
        """The leader term this service publishes with (0 without election; None: standby
        that never led)."""
        return self.leadership.term

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        log.info(
            "topology_starting",
            fabric=self.fabric.name,
            hosts=len(self.fabric.hosts),
            signing_key_id=self.signer.key_id if self.signer is not None else None,
            solve_delays_ms=[
                self.settings.solve.initial_ms,
                self.settings.solve.short_ms,
                self.settings.solve.long_ms,
            ],
        )
        try:  # before anything connects: a port in use stops the start here
            api = self._bind_api()
        except BaseException:
            if self.ledger is not None:
                self.ledger.close()
            raise
        try:
            async with asyncio.TaskGroup() as tg:
                await self._run_tasks(tg, api)
                raise _Stopped  # ends the group: every task is cancelled
        except BaseExceptionGroup as group:
            # a task failed (LeadershipLostError, ...): raised as it is, not as a group
            failed = [e for e in group.exceptions if not isinstance(e, _Stopped)]
            if failed:
                raise failed[0] from None
        finally:
            for t in list(self._reissuing.values()):
                t.cancel()
            # the lease goes now, not at its TTL: a standby takes over at its next poll
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.leadership.resign()
            if self.ledger is not None:  # commits what is queued (a blocking moment at exit)
                self.ledger.close()
            log.info("topology_stopped", solves=self.solves, plans=self.plans_published)
        if (dup := self.core.duplicate) is not None:
            raise DuplicateInstanceError(
                f"another topology service is connected to this broker (instance "
                f"{dup.instance}, started {time.ctime(dup.started_at or 0)})"
                "; run one service per fabric"
            )

    async def _run_tasks(self, tg: asyncio.TaskGroup, api: ApiServer | None) -> None:
        """Start the tasks in ``tg`` and wait until one ends or :meth:`stop`; then announce
        ``offline`` (unless a duplicate) and stop the API gracefully."""
        running = [
            tg.create_task(self._receive(), name="bus"),  # bus -> core: _on_message
            tg.create_task(self._solver(), name="solver"),  # core (_kick) -> solve -> bus
            tg.create_task(self._auditor(), name="auditor"),  # core (_audit_kick) -> bus
            tg.create_task(self._route_around(), name="route_around"),  # core -> route-around
            tg.create_task(self._resender(), name="resender"),  # io (_resend_kick) -> bus
            tg.create_task(self._converge(), name="convergence"),  # core (not acking) -> bus
            tg.create_task(self._lead(), name="leader"),  # election -> _won -> solver, ...
            tg.create_task(self._stop.wait(), name="stop"),  # stop(), a duplicate -> run
        ]
        if self.settings.probes.enabled:  # probe desk -> probe targets on the bus, verdicts
            running.append(tg.create_task(self._prober(), name="prober"))
        serving = tg.create_task(api.serve(), name="api") if api is not None else None
        try:
            await asyncio.wait(
                [*running, *([serving] if serving else [])], return_when=asyncio.FIRST_COMPLETED
            )
            if self.core.duplicate is None:  # never mark the other instance offline
                with contextlib.suppress(TimeoutError):
                    offline = encode(self._status(online=False))
                    async with asyncio.timeout(2):
                        await self.bus.publish(topics.service_status(), offline, retain=True)
        finally:
            if api is not None and serving is not None:  # ends its streams, closes (graceful)
                await api.shutdown(serving)
                self.api = self.api_port = None

    def _bind_api(self) -> ApiServer | None:
        """The HTTP API's server with its socket bound, or None when ``api.enabled`` is false.
        Raises :class:`~linkguard.topology.api.ApiBindError` (a :class:`ConfigError`) when the
        address cannot be bound."""
        if not self.settings.api.enabled:
            return None
        from linkguard.topology.api import ApiServer  # FastAPI only where the API is served

        api = ApiServer(self, self.settings.api)
        self.api_port = api.bind()
        self.api = api
        return api

    # -- bus -> core -> effects ------------------------------------------------------------

    async def _on_message(self, msg: BusMessage) -> None:
        if self.on_discovery is not None and msg.topic.endswith("/discovery"):
            await self.on_discovery(msg)  # the core reads no discovery document
            return
        if msg.topic == _FAULTS_TOPIC:
            await self._on_fabric_faults(msg)
            return
        leading = self.leadership.is_leader()
        now = time.monotonic()
        await self._execute(
            self.core.on_message(msg.topic, msg.payload, msg.retain, now, leading=leading)
        )

    async def _receive(self) -> None:
        """bus -> :meth:`_on_message`, in arrival order; leaving ends the session cleanly."""
        async with contextlib.aclosing(self.bus.messages()) as messages:
            async for message in messages:
                await self._on_message(message)

    def _execute_now(self, effects: list[Effect]) -> None:
        """Carry out the effects that need no await (logs, changes, wake-ups, timers)."""
        for e in effects:
            if isinstance(e, Log):
                getattr(log, e.level)(e.event, **e.fields)
            elif isinstance(e, Emit):
                self.changes.emit(e.kind, e.data)
            elif isinstance(e, ScheduleSolve):
                self._kick.set()
            elif isinstance(e, KickAudit):
                self._audit_kick.set()
            elif isinstance(e, KickRouteAround):
                self._offline_kick.set()
            elif isinstance(e, Reissue):
                self._reissuing[e.topic] = asyncio.create_task(
                    self._reissue_at(e), name=f"reissue:{e.topic}"
                )
            elif isinstance(e, StopDuplicate):
                self.stop()
            else:
                raise TypeError(f"not an effect that runs without awaiting: {e!r}")


class _Stopped(Exception):
    """Raised in the task group to end it (stop(), a duplicate, a task that ended)."""


_FAULTS_TOPIC = topics.fabric_faults()
#: the models of the messages the service reads (the fuzz targets read them here)
_DECODERS = DECODERS


async def run_service(settings: ServiceSettings) -> None:
    """Run until SIGTERM/SIGINT; on a discovered fabric with ``fabric: {discover: ...}``."""
    if isinstance(settings.fabric, FabricDiscovery):
        await run_discovered(settings, settings.fabric)
        return
    service = TopologyService(settings)
    on_stop_signals(service.stop, process="topology")  # a stop that hangs ends after 10 s
    with contextlib.suppress(asyncio.CancelledError):
        await service.run()


async def run_discovered(
    settings: ServiceSettings,
    spec: FabricDiscovery,
    *,
    bus_factory: Callable[..., BusSession] = Bus,
    stop: asyncio.Event | None = None,
) -> None:
    """The service on a discovered fabric: collect the agents' discovery documents
    (``hosts/+/discovery``) for ``settle_s``, build the fabric
    (:class:`~linkguard.topology.discoverdesk.DiscoveryDesk`), run the service on it; when a
    document arrives that changes the fabric (a new host, a re-cabled port), wait ``settle_s``
    more, build again and run the service on the new fabric (its core starts again, as after a
    restart). Until a host can be placed it waits, saying why. Ends on SIGTERM/SIGINT or when
    ``stop`` is set (tests). Raises ConfigError for inputs that cannot be read."""
    desk, expected = await asyncio.to_thread(load_discovery, spec)
    settle = spec.discover.settle_s
    signals = stop is None
    stop = stop if stop is not None else asyncio.Event()
    changed = asyncio.Event()  # collector bus -> this loop
    service: TopologyService | None = None
    running: asyncio.Task[None] | None = None

    def stopping() -> None:
        stop.set()
        if service is not None:
            service.stop()

    if signals:
        on_stop_signals(stopping, process="topology")

    async def take(m: BusMessage) -> None:
        if desk.take(m.topic, m.payload, max_bytes=settings.bus.max_message_bytes):
            changed.set()
        for line in desk.refused:  # a forged or malformed document: said when it arrives
            log.warning("discovery_document_refused", detail=line)
        desk.refused.clear()

    async def quiet(seconds: float) -> bool:
        """Wait ``seconds`` unless stopped; False when stopped."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stop.wait()
        return not stop.is_set()

    # Until the first fabric a connection of its own reads the documents; then the service's
    # connection does (on_discovery): one connection at a time, so a broker that makes the
    # user name the client id (use_username_as_clientid) does not make them take over each
    # other.
    me = Me()
    collector: BusLife | None = None
    made = bus_factory(
        **settings.bus.connection(),
        client_id=f"linkguard-discovery-{me.instance}",
        subscriptions=[topics.all_discovery()],
        handler=take,
    )
    assert isinstance(made, BusLife)  # Bus and MemoryBus: `async with` runs the handler
    collector = await made.__aenter__()
    try:
        fabric: Fabric | None = None
        while await quiet(settle):
            changed.clear()
            result = desk.build()
            _log_discovery(result, desk)
            if result.fabric is None or result.fabric == fabric:
                if service is None:
                    log.warning("fabric_discovery_waiting", documents=len(desk.docs))
                await _first(changed.wait(), stop.wait(), *([running] if running else []))
                if running is not None and running.done():
                    running.result()  # a failure (leadership lost, duplicate) ends the run
                    return
                continue
            if service is not None and running is not None:
                log.info("fabric_discovery_changed", hosts=len(result.fabric.hosts))
                service.stop()
                await running
            if collector is not None:
                await collector.close()
                collector = None
            fabric = result.fabric
            service = TopologyService(
                settings,
                fabric=fabric,
                bus_factory=bus_factory,
                expected=expected,
                discovered=result,
                on_discovery=take,
            )
            running = asyncio.create_task(service.run(), name="service")
            await _first(changed.wait(), stop.wait(), running)
            if running.done():
                running.result()  # a failure (leadership lost, duplicate) ends the run
                return
    finally:
        if collector is not None:
            await collector.close()
        if service is not None and running is not None and not running.done():
            service.stop()
            await running


async def _first(*waits: Coroutine[Any, Any, object] | asyncio.Task[Any]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others (a task passed in is
    left running)."""
    tasks = [
        w if isinstance(w, asyncio.Task) else asyncio.create_task(w, name="discovery-wait")
        for w in waits
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t, w in zip(tasks, waits, strict=True):
            if t is not w:
                t.cancel()


def _log_discovery(result: Discovery, desk: DiscoveryDesk) -> None:
    f = result.fabric
    log.info(
        "fabric_discovered",
        documents=len(desk.docs),
        hosts=len(f.hosts) if f else 0,
        rails=len(f.rails) if f else 0,
        switches=len(f.switches) if f else 0,
        unknowns=len(result.unknowns),
    )
    for u in result.unknowns:
        log.warning(
            "fabric_discovery_unknown", host=u.host, device=u.device, rule=u.rule, detail=u.detail
        )
    for line in desk.refused:
        log.warning("discovery_document_refused", detail=line)
    desk.refused.clear()
