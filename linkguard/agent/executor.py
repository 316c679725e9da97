"""The executors of the agent's effects (:mod:`linkguard.agent.effects`).

Consumes: the effect lists :class:`~linkguard.agent.core.AgentCore` returns. Produces: kernel
route changes (through the :class:`~linkguard.agent.applier.Applier`, under its lock),
retained states and acks and the events on the bus, the state dir's files
(:mod:`linkguard.agent.statefiles`), the NCCL files, rail changes for the hooks and the rails
socket, metrics. :class:`EffectExecutor` is the base of the wiring's
:class:`~linkguard.agent.daemon.Agent`, which owns the parts it names; it creates no task (a
:class:`~linkguard.agent.effects.FlushNeighbours` in the background is started by the wiring).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import structlog

from linkguard import __version__, topics
from linkguard.agent.applier import Applier
from linkguard.agent.core import AgentCore, AgentStats
from linkguard.agent.effects import (
    ApplyPlan,
    CheckBehind,
    Effect,
    FastPath,
    FlushNeighbours,
    MarkPortUp,
    ObserveAck,
    ObserveEvents,
    PersistHealth,
    PersistHistory,
    PersistJournal,
    PersistPeerRoutes,
    PersistPlan,
    PersistTerm,
    PublishEvent,
    PublishState,
    RailChange,
    Reannounce,
    RenderNccl,
    RequestPlan,
    ResendAck,
    ScheduleTimer,
    SendAck,
    Yield,
)
from linkguard.agent.hooks import HookRunner
from linkguard.agent.inbox import Inbox
from linkguard.agent.localsub import RailMapServer
from linkguard.agent.monitor import PortMonitor
from linkguard.agent.outbox import Outbox
from linkguard.agent.railmap import RailChanges, rail_view
from linkguard.agent.statefiles import StateFiles
from linkguard.bus import BusMessage, BusSession
from linkguard.metrics import AgentMetrics
from linkguard.models import (
    Ack,
    AckResult,
    BadMessage,
    HostInventory,
    HostStatus,
    PeerRoutes,
    Plan,
    PlanRequest,
    PortState,
    ProbeReport,
    ProbeTargets,
    decode,
    encode,
)
from linkguard.models.discovery import HostDiscovery
from linkguard.nccl import NcclFiles
from linkguard.presence import Me

if TYPE_CHECKING:
    from linkguard.agent.prober import ProbeRunner
    from linkguard.config import AgentSettings

__all__ = ["EffectExecutor"]

log = structlog.get_logger(__name__)


class EffectExecutor:
    """Runs effects in order (:meth:`execute`); the parts are set by the wiring."""

    settings: AgentSettings
    host: str
    core: AgentCore
    inventory: HostInventory
    rails: dict[str, int]
    monitor: PortMonitor
    applier: Applier
    files: StateFiles
    nccl: NcclFiles
    rail_changes: RailChanges
    hooks: HookRunner
    rails_socket: RailMapServer | None
    metrics: AgentMetrics
    bus: BusSession
    last_ack: Ack | None
    _lock: asyncio.Lock
    _wake: asyncio.Event
    _deadline: float | None
    _announced: bool
    #: acks, status, plan requests and replayed events waiting for the ``outbox`` task
    outbox: Outbox
    _outbox_wake: asyncio.Event
    _outbox_cut: asyncio.Timeout | None = None
    _resend_wake: asyncio.Event
    #: whether the retained status last said a state file fails to be written
    _state_write_failing_said: bool = False
    duplicate: HostStatus | None
    #: what discovery found wrong with the host's devices (HostStatus.device_problems)
    device_problems: list[str]
    me: Me
    inbox: Inbox
    prober: ProbeRunner | None
    #: what ``fabric discover`` reads (linkguard.agent.discoveryio); None until collected
    discovery: HostDiscovery | None = None

    def stop(self) -> None:
        """Stop the agent (the wiring's)."""
        raise NotImplementedError

    @property
    def stats(self) -> AgentStats:
        """The core's counters."""
        return self.core.stats

    @property
    def term(self) -> int:
        """The highest leader term seen (the core's; persisted in ``state_dir/term``)."""
        return self.core.term

    @property
    def plan_received(self) -> Plan | None:
        """The last plan off the bus (compact or full)."""
        return self.core.plan_received

    @property
    def peers(self) -> dict[str, PeerRoutes]:
        """Retained peer routes, by peer."""
        return self.core.peers

    async def execute(self, effects: Iterable[Effect]) -> None:
        """Run ``effects`` in order; the core's answers to an apply run right after it."""
        for effect in effects:
            await self._execute(effect)

    async def _execute(self, e: Effect) -> None:
        if isinstance(e, ObserveEvents):
            self.metrics.observe_events(list(e.events))
        elif isinstance(e, ObserveAck):
            self.metrics.observe_ack(e.ack)
        elif isinstance(e, FastPath):
            async with self._lock:
                ack = await self.applier.port_down(e.port)
            await self.execute(self.core.fast_path_applied(e.port, ack))
        elif isinstance(e, MarkPortUp):
            async with self._lock:
                await self.applier.port_back(e.port)
        elif isinstance(e, ApplyPlan):
            async with self._lock:
                ack = await self.applier.put(e.plan, persist=e.persist_json)
                if e.raw is not None:
                    self.applier.writes.write("plan", self.applier.plan_path, e.raw)
            await self._report_state_writes()
            await self.execute(self.core.plan_applied(ack))
        elif isinstance(e, SendAck):
            await self._send_ack(e.ack)
        elif isinstance(e, ResendAck):
            last = self.last_ack
            if self._announced and last is not None and last.epoch >= e.epoch:
                log.info("ack_resent", epoch=last.epoch, result=last.result.value)
                # named again: peer routes taken since without a new apply count too
                self._post(topics.ack(self.host), encode(self.core.named(last)), retain=True)
        elif isinstance(e, RequestPlan):
            if self._announced:  # (else the announce asks)
                req = PlanRequest(host=self.host, epoch=e.epoch, reason=e.reason, at=time.time())
                self._post(topics.plan_request(self.host), encode(req), retain=False)
        elif isinstance(e, CheckBehind):
            self._resend_wake.set()
        elif isinstance(e, PublishState):
            await self._publish_state(e.state)
        elif isinstance(e, PublishEvent):
            ev = e.event
            (log.debug if e.replay else log.info)(
                "port_event_replayed" if e.replay else "port_event",
                port=f"{ev.hca}/{ev.port}",
                rail=ev.rail,
                previous=ev.previous.value,
                current=ev.current.value,
                reason=ev.reason,
                seq=ev.seq,
            )
            if self._announced and e.replay:  # never holds up the bus messages' handling
                key = f"{topics.events(self.host)}#{ev.journal}/{ev.seq}"
                self._post(topics.events(self.host), encode(ev), retain=False, key=key)
            elif self._announced:
                await self.bus.publish(topics.events(self.host), encode(ev), retain=False)
        elif isinstance(e, FlushNeighbours):  # background: the wiring starts it as a task
            await self._flush_neighbours()
        elif isinstance(e, PersistHistory):
            self.files.save_history(now=time.monotonic(), wall=time.time())
            await self._report_state_writes()
        elif isinstance(e, PersistHealth):
            self.files.save_health(now=time.monotonic(), wall=time.time())
            await self._report_state_writes()
        elif isinstance(e, PersistJournal):
            self._resend_wake.set()  # new events: the resend task schedules them
            if self.core.journal is not None:
                self.files.save_journal(self.core.journal)
                await self._report_state_writes()
        elif isinstance(e, PersistTerm):
            self.files.save_term(e.term)
            await self._report_state_writes()
        elif isinstance(e, PersistPlan):
            self.applier.writes.write("plan", self.applier.plan_path, e.raw)
            await self._report_state_writes()
        elif isinstance(e, PersistPeerRoutes):
            path = self.applier.peers_dir / f"{e.peer}.json"
            self.applier.writes.write("peer_routes", path, e.raw)
            await self._report_state_writes()
        elif isinstance(e, RenderNccl):
            self._render_nccl()
        elif isinstance(e, RailChange):
            self._rail_change(e.reason)
        elif isinstance(e, Yield):
            self.duplicate = e.other
            self.stop()
        elif isinstance(e, Reannounce):
            await self.bus.publish(
                topics.status(self.host), encode(self._status(online=True)), retain=True
            )
            # whatever the other published (inventory, port states) is now wrong: put ours back
            await self._announce()
        elif isinstance(e, ScheduleTimer):
            self._deadline = e.deadline
            self._wake.set()

    async def _report_state_writes(self) -> None:
        """Republish the retained status when whether a state file fails to be written changed
        (:mod:`linkguard.agent.statewrites`): the service flags the host while it does."""
        failing = bool(self.applier.writes.failing)
        if failing == self._state_write_failing_said:
            return
        self._state_write_failing_said = failing
        if self.duplicate is None:  # (disconnected: the status on connect says it)
            self._post(topics.status(self.host), encode(self._status(online=True)), retain=True)

    async def _send_ack(self, ack: Ack) -> None:
        self.last_ack = ack = self.core.named(ack)
        if self._announced:  # else the announce publishes it
            self._post(topics.ack(self.host), encode(ack), retain=True)

    # -- the outbox (linkguard.agent.outbox) ---------------------------------------------
    def _post(self, topic: str, payload: bytes, *, retain: bool, key: str | None = None) -> None:
        """Hand a message to the ``outbox`` task (latest wins per ``key``, default the
        topic); the wait for the PUBACK of the message in flight ends (it is sent already)."""
        self.outbox.put(key or topic, topic, payload, retain=retain)
        self._outbox_wake.set()
        cut = self._outbox_cut  # stop waiting for the PUBACK of the one in flight
        if cut is not None and not cut.expired():  # (an expired one cannot be rescheduled)
            cut.reschedule(0)

    async def _drain_outbox(self) -> None:
        """outbox -> bus, one message at a time in order (the wiring's ``outbox`` task). The
        wait for a message's PUBACK ends as soon as another one waits (its PUBLISH was handed
        to the MQTT client before the wait, and the client sends in call order; both
        :class:`~linkguard.bus.Bus` and :class:`~linkguard.membus.MemoryBus` hand a message
        over before their first suspension): one lost PUBACK holds back nothing. A publish
        that fails or times out is not repeated: an ack comes again with the service's
        re-send (:class:`ResendAck`), events with the journal's, the status and plan request
        with the next connect."""
        while True:
            await self._outbox_wake.wait()
            item = self.outbox.take()
            if item is None:
                self._outbox_wake.clear()
                continue
            try:
                async with asyncio.timeout(0 if len(self.outbox) else None) as cut:
                    self._outbox_cut = cut
                    await self.bus.publish(item.topic, item.payload, retain=item.retain)
            except TimeoutError:
                log.debug("outbox_puback_not_awaited", topic=item.topic)
            finally:
                self._outbox_cut = None
                self.outbox.done()

    async def _publish_state(self, st: PortState) -> None:
        if not self._announced:  # the announce publishes the current snapshot
            return
        self.stats.states_published += 1
        await self.bus.publish(
            topics.port_state(self.host, st.hca, st.port), encode(st), retain=True
        )

    async def _flush_neighbours(self) -> None:
        """The neighbour entries the last route changes left stale (the applier's
        ``flush_stale``), under the applier's lock: the netlink socket takes one request at
        a time."""
        async with self._lock:
            await self.applier.flush_stale()

    def _render_nccl(self) -> None:
        """Rewrite the NCCL files from the applied plan and the ports' states (only what
        changed; a failure is logged by :class:`~linkguard.nccl.NcclFiles`, never raised)."""
        states = [self.monitor.state(h.key) for h in self.inventory.hcas]
        self.nccl.update(self.inventory, [s for s in states if s is not None], self.applier.plan)

    def _rail_change(self, reason: str) -> None:
        """Hand what jobs see (GPU -> HCA map, rails lost, ports out of use) to the hooks and
        the rails socket when it changed (:mod:`linkguard.agent.railmap`), after rewriting the
        NCCL files to match it; never waits."""
        if not self.settings.hooks and self.rails_socket is None:
            return
        view = rail_view(
            plan=self.applier.plan,
            locally_down=self.applier.locally_down,
            rails=self.rails,
            states=self.monitor.snapshot(wall=time.time()),
        )
        change = self.rail_changes.observe(view, now=time.time(), reason=reason)
        if change is None:
            return
        # nccl.env first: a job that restarts on this change (linkguard.jobwatch) through
        # `linkguard exec` must read the rails it announces, never the ones before it
        self._render_nccl()
        self.hooks.submit(change)
        if self.rails_socket is not None:
            self.rails_socket.publish(change)

    # -- presence, probes, shutdown -----------------------------------------------------
    def _restore_previous_run(self) -> None:
        """After the applier's start: the plan and peer routes it restored go to the core
        (retained copies of these change nothing, and older ones, replays, are stale against
        them), the term too (:meth:`_restore_term`), and the restored plan's ack is kept to be
        announced on connect (it replaces a stale one); the rail change of the start."""
        if self.applier.restored is not None:
            received, peers = self.applier.restored
            self.core.restore(received=received, peers=peers)
        self._restore_term()
        if self.applier.plan is not None:
            errors = self.applier.last_result.errors if self.applier.last_result else []
            self.last_ack = Ack(
                host=self.host,
                epoch=self.applier.plan.epoch,
                result=AckResult.FAILED if errors else AckResult.APPLIED,
                error="; ".join(f"{d}: {m}" for d, m in errors)[:2000] or None,
                applied_at=time.time(),
            )
            self._rail_change("start")

    def _restore_term(self) -> None:
        """The highest term of the previous run: its file, or the restored plan's and peer
        routes' (whichever is higher). An unreadable file counts as 0 (logged)."""
        self.core.restore_term(self.files.read_term())

    def _status(
        self, *, online: bool, reason: Literal["stopped", "lost"] | None = None
    ) -> HostStatus:
        """This agent's status message (``online``; ``reason`` of an offline one)."""
        return HostStatus(
            host=self.host,
            online=online,
            reason=reason,
            at=time.time(),
            version=__version__,
            instance=self.me.instance,
            started_at=self.me.started_at,
            signing=self.inbox.posture(),
            state_write_failing=True if online and self.applier.writes.failing else None,
            device_problems=[p[:300] for p in self.device_problems[:16]] or None,
        )

    async def _announce(self, delay_s: float = 0.0) -> None:
        """Publish everything the service should know of this host, from current state."""
        if delay_s:
            await asyncio.sleep(delay_s)
        if self.duplicate is not None:
            return
        self._announced = True
        await self.bus.publish(topics.inventory(self.host), encode(self.inventory), retain=True)
        if self.discovery is not None:
            await self.bus.publish(topics.discovery(self.host), encode(self.discovery), retain=True)
        for st in self.monitor.snapshot(wall=time.time()):
            await self._publish_state(st)
        if self.last_ack is not None:
            last = self.core.named(self.last_ack)
            await self.bus.publish(topics.ack(self.host), encode(last), retain=True)
        # it may have missed plans while away (or a QoS 0 delivery): the service re-sends them
        # when the epoch applied here is below the one it owes (linkguard.topology.convergence)
        request = PlanRequest(
            host=self.host, epoch=self.applier.applied_epoch, reason="reconnect", at=time.time()
        )
        await self.bus.publish(topics.plan_request(self.host), encode(request), retain=False)
        # events published while the broker was away (or nobody listened) go again
        await self.execute(self.core.replay_events())

    def _on_probe_targets(self, msg: BusMessage) -> None:
        """``probes/<host>``: probe these from now on. Unsigned (they pick whom to probe and
        change no route; the broker's ACL lets only the service publish them); a bad one is
        dropped and counted like any message. An empty one (the service deleted the
        retained targets) stops the probes."""
        if self.prober is None:
            return
        if not msg.payload:
            self.prober.clear_targets()
            return
        try:
            targets = decode(
                ProbeTargets,
                msg.payload,
                topic=msg.topic,
                expect_host=self.host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except BadMessage as exc:
            self.inbox.drop(msg, exc.reason, exc.detail)
            return
        self.prober.set_targets(targets)

    async def _publish_probes(self, report: ProbeReport) -> None:
        await self.bus.publish(topics.probe_report(self.host), encode(report), retain=False)

    async def _shutdown(self) -> None:
        """Withdraw the routes when the shutdown policy says so, or when this agent was a
        duplicate."""
        # a duplicate applied another machine's plans: never leave those routes behind
        if self.settings.shutdown_policy == "withdraw" or self.duplicate is not None:
            async with self._lock:
                await self.applier.withdraw()
            log.info("agent_withdrew_routes", table=self.settings.routes.table)
        log.info("agent_stopped", host=self.host)
