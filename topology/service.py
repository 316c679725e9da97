"""The topology service's wiring module: the only place that creates its tasks and executes the
effects of its core (:class:`~linkguard.topology.core.ServiceCore`).

Channels (``producer -> consumer``)::

    bus handler -> core             every message (core.on_message), fabric/faults -> io
    core -> solver task             ScheduleSolve: _kick (an Event), due time in core.backoff
    core -> auditor task            KickAudit: _audit_kick
    core -> route_around task       KickRouteAround: _offline_kick
    core -> reissue:<topic> task    Reissue: this service's own plan put back at its time
    solver / prober -> io -> bus    plans, peer routes, probe targets (retained, signed)
    io -> resender task             what the broker did not take: io.unsent, _resend_kick
    core / io -> changes            Emit: the change feed -> ledger, HTTP API stream
    leader task -> solver, auditor  _won: this service leads (at once without election)

Tasks: ``bus``, ``solver`` (waits for a change, waits as the RFC 8405 back-off says
(:mod:`linkguard.topology.backoff`), solves off the event loop, publishes), ``auditor`` (the
fleet audit, retained on ``service/audit``), ``route_around``, ``resender``, ``leader``
(:mod:`linkguard.topology.leader`), ``prober`` (with ``probes.enabled``), ``api`` (with
``api.enabled``: :mod:`linkguard.topology.api`, bound before the bus connects) and one
``reissue:<topic>`` per foreign message being answered. What is published and how
(signing, windows, re-sends, fabric faults, health, stale plans) is
:mod:`linkguard.topology.serviceio`; what to do about each message is the core's.

With ``leader.etcd`` or ``leader.kubernetes`` several services run for one fabric: each
connects and reads the bus (a warm standby), every publish passes the leadership fence, and
only the lease holder solves and publishes, stamping its term on every plan. A leader that
loses the lease stops publishing at once and :meth:`TopologyService.run` raises
:class:`~linkguard.topology.leader.LeadershipLostError`; a clean stop revokes the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from linkguard import topics
from linkguard.bus import Bus, BusMessage, BusSession, Will
from linkguard.config import ServiceSettings
from linkguard.ledger import Ledger
from linkguard.models import ProbeReport, ProbeTargets, encode
from linkguard.presence import DuplicateInstanceError, Me
from linkguard.signing import Signer
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.core import DECODERS, ServiceCore
from linkguard.topology.effects import (
    AnnounceOnline,
    ClearRetained,
    ClearStalePlans,
    Effect,
    Emit,
    KickAudit,
    KickRouteAround,
    Log,
    PublishPlans,
    Reissue,
    ScheduleSolve,
    StopDuplicate,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.faultsio import FaultsIO
from linkguard.topology.leader import FencedBus, LeadershipLostError, leadership_from_settings
from linkguard.topology.localize import Verdict as ProbeVerdict
from linkguard.topology.serviceio import ServiceIO, fabric_from_settings

if TYPE_CHECKING:
    from linkguard.topology.api import ApiServer

__all__ = ["TopologyService", "fabric_from_settings", "run_service"]

log = structlog.get_logger(__name__)


class TopologyService(FaultsIO):
    """``await service.run()`` until cancelled or :meth:`stop`."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        fabric: Fabric | None = None,
        bus_factory: Callable[..., BusSession] = Bus,
    ) -> None:
        """``bus_factory`` makes the bus session (takes :class:`~linkguard.bus.Bus`'s keyword
        arguments); simulations pass an in-memory bus. Raises KeyFileError (a ConfigError)
        for a ``signing_key`` file that cannot be used, e.g. mode 0644."""
        self.settings = settings
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
            handler=self._on_message,
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
        tasks = [
            asyncio.create_task(self.bus.run(), name="bus"),
            asyncio.create_task(self._solver(), name="solver"),
            asyncio.create_task(self._auditor(), name="auditor"),
            asyncio.create_task(self._route_around(), name="route_around"),
            asyncio.create_task(self._resender(), name="resender"),
            asyncio.create_task(self._lead(), name="leader"),
        ]
        if self.settings.probes.enabled:
            tasks.append(asyncio.create_task(self._prober(), name="prober"))
        if api is not None:
            tasks.append(asyncio.create_task(api.serve(), name="api"))
        try:
            stop = asyncio.create_task(self._stop.wait(), name="stop")
            done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = t.exception() if t is not stop else None
                if exc is not None:
                    raise exc
            if self.core.duplicate is None:  # never mark the other instance offline
                with contextlib.suppress(TimeoutError):
                    offline = encode(self._status(online=False))
                    await asyncio.wait_for(
                        self.bus.publish(topics.service_status(), offline, retain=True), 2
                    )
        finally:
            if api is not None:  # ends its streams, closes its connections (graceful first)
                await api.shutdown(tasks[-1])
                self.api = self.api_port = None
            for t in [*tasks, *self._reissuing.values()]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # the lease goes now, not at its TTL: a standby takes over at its next poll
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.leadership.resign(), 5)
            if self.ledger is not None:  # commits what is queued (a blocking moment at exit)
                self.ledger.close()
            log.info("topology_stopped", solves=self.solves, plans=self.plans_published)
        if (dup := self.core.duplicate) is not None:
            raise DuplicateInstanceError(
                f"another topology service is connected to this broker (instance "
                f"{dup.instance}, started {time.ctime(dup.started_at or 0)})"
                "; run one service per fabric"
            )

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

    async def _lead(self) -> None:
        """Campaign (at once without election); once leading, announce it and let the solver
        run; when the lease is lost, stop: :meth:`run` raises :class:`LeadershipLostError`."""
        if self.leadership.elected:
            log.info("leader_standby", **self.leadership.describe())
        term = await self.leadership.campaign()
        self.core.state.set_term(term)
        self._won.set()
        if self.leadership.elected:
            log.info("leader_active", **self.leadership.describe())
            if self.bus.connected.is_set():  # else _on_connect announces it
                await self._announce()
                await self._publish_health()
        await self.leadership.lost.wait()
        raise LeadershipLostError(
            f"lost the leader lease (term {term}): "
            f"{getattr(self.leadership, 'why_lost', None) or 'lost'}; stopped publishing. "
            "Restart it (systemd Restart=on-failure does) and it waits as a standby"
        )

    # -- bus -> core -> effects ------------------------------------------------------------

    async def _on_message(self, msg: BusMessage) -> None:
        if msg.topic == _FAULTS_TOPIC:
            await self._on_fabric_faults(msg)
            return
        leading = self.leadership.is_leader()
        now = time.monotonic()
        await self._execute(
            self.core.on_message(msg.topic, msg.payload, msg.retain, now, leading=leading)
        )

    async def _execute(self, effects: list[Effect]) -> None:
        """Carry out the core's ``effects`` in order."""
        for e in effects:
            if isinstance(e, PublishPlans):
                await self._publish_plans(e)
            elif isinstance(e, ClearRetained):  # once: the next foreign message asks again
                for topic in e.topics:
                    await self.bus.publish(topic, b"", retain=True)
            elif isinstance(e, ClearStalePlans):
                await self._clear_stale_plans()
            elif isinstance(e, AnnounceOnline):
                await self._announce()
            else:
                self._execute_now([e])

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

    async def _reissue_at(self, e: Reissue) -> None:
        try:
            delay = e.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._execute(self.core.reissue_due(e.kind, e.host, time.monotonic()))
        finally:
            self.core.integrity.reissue_done(e.topic)
            self._reissuing.pop(e.topic, None)

    # -- tasks -----------------------------------------------------------------------------

    async def _solver(self) -> None:
        await self.bus.connected.wait()
        await self._settle()  # let retained states and plans arrive
        await self._won.wait()  # a standby keeps its state warm but never solves
        self._execute_now(self.core.settle())
        await self._adopt_inherited_faults()
        await self._clear_stale_plans()
        if not self.settings.probes.enabled:
            await self._clear_probe_targets(sorted(self.core.state.host_names), "probes disabled")
        while True:
            # clear before solving: a change that arrives during the solve (it runs in a
            # thread) leaves the kick set and schedules its own solve
            self._kick.clear()
            if self.core.schedule.solve_started(time.monotonic()):
                await self._solve_and_publish()
                if self._degraded_rails() != self._health_degraded:
                    await self._publish_health()  # why multipaths now avoid (or use) a rail
            await self._kick.wait()
            due = self.core.schedule.backoff.due
            if due is not None and due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())

    async def _route_around(self) -> None:
        """Route around lost hosts when their grace period ends (the core decides which)."""
        while True:
            self._offline_kick.clear()
            effects, due_at = self.core.schedule.route_around(time.monotonic())
            self._execute_now(effects)
            timeout = None if due_at is None else max(0.0, due_at - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._offline_kick.wait(), timeout)

    async def _prober(self) -> None:
        """With ``probes.enabled``: publish every host's probe targets (retained) at the start
        of each probe epoch (``epoch_s``; epoch = Unix time // epoch_s), and localise faults
        from the reports every ``window_s`` (:meth:`localize_probes`)."""
        cfg = self.settings.probes
        await self.bus.connected.wait()
        await self._won.wait()
        published: int | None = None
        while True:
            epoch = int(time.time() // cfg.epoch_s)
            if epoch != published:
                msgs = await asyncio.to_thread(self.probe_targets, epoch)
                self._probe_targets_sent = [(topics.probe_targets(m.host), encode(m)) for m in msgs]
                await self._publish_retained(self._probe_targets_sent)
                published = epoch
                log.info("probe_targets_published", epoch=epoch, hosts=len(msgs))
            desk = self.core.probes
            if desk.localizer is not None:
                now = time.monotonic()
                results = desk.fresh_results(now)
                verdicts = await asyncio.to_thread(desk.localizer.update, results, now)
                self.localize_probes(now=now, verdicts=verdicts)
            await asyncio.sleep(cfg.window_s)

    # -- what other code and tests call (delegated to the core) ------------------------------

    def probe_targets(self, epoch: int) -> list[ProbeTargets]:
        """Every host's probe targets of ``epoch`` (:meth:`ProbeDesk.targets`)."""
        return self.core.probes.targets(epoch)

    def localize_probes(
        self, *, now: float, verdicts: list[ProbeVerdict] | None = None
    ) -> list[ProbeVerdict]:
        """Localise at ``now`` (monotonic s) and act on the verdicts
        (:meth:`ProbeDesk.localize`); returns the verdicts acted on."""
        acted, effects = self.core.probes.localize(now, verdicts)
        self._execute_now(effects)
        return acted

    def probe_verdicts(self, *, now: float | None = None) -> list[dict[str, object]]:
        """The probe verdicts in force (:meth:`ProbeDesk.verdicts`); ``now``: the monotonic
        clock of :meth:`localize_probes` (default ``time.monotonic()``)."""
        mono = time.monotonic() if now is None else now
        return self.core.probes.verdicts(mono, time.time())

    def _on_probe_report(self, report: ProbeReport, *, now: float) -> None:
        self._execute_now(self.core.probes.on_report(report, now))

    def _warn_unknown_ports(self) -> None:
        self._execute_now(self.core.warn_unknown_ports())


_FAULTS_TOPIC = topics.fabric_faults()
#: the models of the messages the service reads (the fuzz targets read them here)
_DECODERS = DECODERS


async def run_service(settings: ServiceSettings) -> None:
    """Run until SIGTERM/SIGINT."""
    service = TopologyService(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    with contextlib.suppress(asyncio.CancelledError):
        await service.run()
