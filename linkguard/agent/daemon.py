"""The agent's wiring module: the one place where its tasks are connected.

Decisions are :class:`~linkguard.agent.core.AgentCore`'s (fast path, plan acceptance, peer
routes); this module owns the bus, the tasks, the kernel and disk drivers, and runs the
effects the core returns (:mod:`linkguard.agent.executor`). Channels, ``producer -> consumer``:

- ``watch``: driver observations -> monitor -> core -> effects (fast path, states, events, ...)
- ``timer``: monitor deadlines (hold-down expiry, penalty decay) -> monitor.tick -> core
- ``refresh``: monitor snapshot -> bus (every port state, each ``refresh_interval_s``)
- ``resend``: the core's timed decisions (journal events unconfirmed past their wait; a plan
  request when a newer version than the plan in hand stays unexplained) -> outbox -> bus;
  woken by newly journaled events and by such a version
- ``bus``: MQTT session -> :meth:`Agent._on_message` (plans, peer routes, status, probe
  targets; handled in arrival order) -> core -> effects; states/events/acks back out
- ``outbox``: acks, the status, plan requests and replayed events -> bus, in order, latest
  wins per topic (:mod:`linkguard.agent.outbox`): handling a message never waits for a PUBACK
- ``hooks`` and ``rails-socket``: rail changes (:mod:`linkguard.agent.railmap`) -> job-facing
  commands (:mod:`linkguard.agent.hooks`) and local subscribers
  (:mod:`linkguard.agent.localsub`); the event loop never waits for them
- ``probes``: probe targets -> per-rail probes -> probe reports on the bus
- ``neighbour-flush``: a fast path -> the applier's stale neighbour entries, beside the
  events' publishes, awaited at the end of the batch

The monitor and applier are only touched from the event loop, so no locks are needed beyond
the applier lock around kernel changes. A compact plan (``Plan.shared``) is applied expanded
with the retained peer routes (``peers/+``, :func:`~linkguard.models.expand_plan`), again
whenever one of them changes; the ack carries the expanded plan's epoch. Plans and peer
routes are signed by the service (:mod:`linkguard.signing`) when the agent holds its public
key (``service_public_key``): :mod:`linkguard.agent.inbox` drops and counts a bad one before
it is decoded; what is kept in the state dir is the payload as received.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from linkguard import topics
from linkguard.agent.applier import RouteTableLike
from linkguard.agent.assembly import (
    discover,
    hold_agent_lock,
    log_plan_verification,
    make_applier,
    make_core,
    make_inbox,
    make_inventory,
    make_monitor,
    make_prober,
    make_rails_socket,
    make_source,
    make_table,
    make_verifier,
    read_layout,
    subscriptions,
)
from linkguard.agent.core import AgentStats
from linkguard.agent.dispatch import MessageDispatch
from linkguard.agent.effects import FlushNeighbours
from linkguard.agent.hooks import HookRunner
from linkguard.agent.inventory import DiscoveredPort, lag_problems
from linkguard.agent.monitor import MonitorOutput
from linkguard.agent.outbox import Outbox
from linkguard.agent.railmap import RailChanges
from linkguard.agent.statefiles import StateFiles
from linkguard.bus import Bus, BusSession, Will
from linkguard.config import AgentSettings
from linkguard.drivers.base import PortSource
from linkguard.metrics import AgentMetrics
from linkguard.models import (
    HostStatus,
    encode,
)
from linkguard.nccl import NcclFiles
from linkguard.presence import DuplicateInstanceError, Me
from linkguard.signing import Verifier
from linkguard.stopdeadline import on_stop_signals

__all__ = ["Agent", "AgentStats", "DuplicateHostError", "discover", "make_source", "run_agent"]

if TYPE_CHECKING:
    from linkguard.agent.prober import ProbeRunner

log = structlog.get_logger(__name__)

#: After connecting, an agent waits this long (s) for a running agent with the same host name
#: to object before it publishes its inventory and port states.
PRESENCE_SETTLE_S = 0.3


class Agent(MessageDispatch):
    """One host's agent. ``await agent.run()`` until cancelled or :meth:`stop`."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        source: PortSource | None = None,
        table: RouteTableLike | None = None,
        discovered: Sequence[DiscoveredPort] | None = None,
        bus_factory: Callable[..., BusSession] = Bus,
    ) -> None:
        """``bus_factory`` makes the bus session (takes :class:`~linkguard.bus.Bus`'s keyword
        arguments); simulations pass an in-memory bus."""
        s = self.settings = settings
        self.host = settings.host
        self.me = Me()
        found = discover(settings) if discovered is None else discovered
        self.inventory = make_inventory(settings, found)
        self.device_problems = lag_problems(found)  # in the status (HostStatus)
        self.rails = {h.key: h.rail for h in self.inventory.hcas}
        #: the service's public key (None: plans are applied unverified)
        self.verifier: Verifier | None = make_verifier(settings)
        self.require_signed = s.require_signed_plans
        self.source = source if source is not None else make_source(settings, self.inventory, found)
        self.table = table if table is not None else make_table(settings)
        self.monitor = make_monitor(settings, self.rails)
        netdevs = {h.netdev for h in self.inventory.hcas if h.netdev}
        self.applier = make_applier(settings, self.table, netdevs, self.verifier)
        self.files = StateFiles(
            s.state_dir,
            monitor=self.monitor,
            counter_health_enabled=s.counter_health.enabled,
            writes=self.applier.writes,
        )
        self.files.restore_history(now=time.monotonic(), wall=time.time())
        self.files.restore_health(now=time.monotonic(), wall=time.time())
        #: the decisions: fast path, plan acceptance, peer routes, leader term
        self.core = make_core(settings, netdevs, self.verifier, str(self.files.term_path))
        self.core.use_journal(self.files.load_journal(limit=s.journal_max_events, host=self.host))
        self.inbox = make_inbox(settings, self.core, self.verifier)
        #: NCCL settings for jobs starting now, next to the rail map (linkguard.nccl)
        self.nccl = NcclFiles(s.rail_map_path.parent, topology_file=s.nccl_topo_file)
        #: what jobs see: changes go to the hooks and the rails socket (linkguard.agent.railmap)
        self.rail_changes = RailChanges(self.host)
        self.hooks = HookRunner(s.hooks)
        #: per-rail probes toward the service's targets (``probes.enabled``; None: off)
        self.prober: ProbeRunner | None = make_prober(settings)
        self.rails_socket = make_rails_socket(
            settings, current=lambda: self.rail_changes.current(now=time.time())
        )
        #: Prometheus metrics (its own registry); the exporter runs while :meth:`run` does
        self.metrics = AgentMetrics(self)
        self.last_ack = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()  # timer task's wake-up: executor (ScheduleTimer) -> timer
        self._deadline = None
        self._stop = asyncio.Event()  # stop() / a duplicate -> run
        self.duplicate: HostStatus | None = None
        self._announcer: asyncio.Task[None] | None = None
        self._announced = False  # states, events and acks wait for the presence check
        # executor (acks, status, plan requests, replayed events) -> outbox -> bus: the
        # handling of bus messages never waits for a PUBACK (linkguard.agent.outbox)
        self.outbox = Outbox()
        self._outbox_wake = asyncio.Event()
        # executor (PersistJournal, CheckBehind) -> resend: the core has something new to time
        self._resend_wake = asyncio.Event()
        self.bus = bus_factory(
            **s.bus.connection(),
            client_id=f"linkguard-agent-{self.host}-{self.me.instance}",
            subscriptions=subscriptions(settings),
            on_connect=self._on_connect,
            will=Will(topics.status(self.host), encode(self._status(online=False, reason="lost"))),
            # a PUBACK that never comes must not hold the port loop (fast path, events): the
            # lab chaos run measured a 10 s stall (docs/simulations.md, "Lab chaos run")
            puback_wait=False,
        )

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        log.info(
            "agent_starting",
            host=self.host,
            driver=self.settings.driver,
            ports=[f"{h.key}=rail{h.rail}" for h in self.inventory.hcas],
            table=self.settings.routes.table,
            netns=self.settings.netns,
        )
        log_plan_verification(self.settings, self.verifier)
        async with contextlib.AsyncExitStack() as stack:
            lock = hold_agent_lock(self.settings)
            if lock is not None:
                stack.callback(lock.release)
            await self.metrics.start(self.settings.metrics_listen)
            stack.push_async_callback(self.metrics.stop)  # frees the port on any exit
            await stack.enter_async_context(self.table)  # opens the netlink socket
            await self._run()
        if self.duplicate is not None:
            raise DuplicateHostError(
                f"another agent is running as host {self.host!r} (instance "
                f"{self.duplicate.instance}, started {time.ctime(self.duplicate.started_at or 0)})"
                "; host names must be unique (cloned machine?). Set `host:` in the config."
            )

    async def _run(self) -> None:
        self.inventory = await read_layout(self.settings, self.inventory)
        async with self._lock:
            await self.applier.start()
        self._restore_previous_run()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive(), name="bus")  # bus -> core, prober
                tg.create_task(self._drain_outbox(), name="outbox")  # executor -> outbox -> bus
                tg.create_task(self._watch(), name="watch")
                tg.create_task(self._timer(), name="timer")
                tg.create_task(self._refresh(), name="refresh")
                tg.create_task(self._resend(), name="resend")  # core's timed decisions -> bus
                tg.create_task(self._expect_plan(), name="expect-plan")
                tg.create_task(self.hooks.run(), name="hooks")
                if self.rails_socket is not None:
                    tg.create_task(self.rails_socket.serve(), name="rails-socket")
                if self.prober is not None:  # probes -> bus
                    tg.create_task(self.prober.run(self._publish_probes), name="probes")
                await self._stop.wait()
                self.outbox.clear()  # nothing queued goes out after the last status
                if self.duplicate is None:  # never mark the other instance offline
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(2):
                            await self.bus.publish(
                                topics.status(self.host),
                                encode(self._status(online=False, reason="stopped")),
                                retain=True,
                                wait_puback=True,  # taken before the disconnect: no will
                            )
                raise _Stopped
        except* _Stopped:
            pass
        finally:
            if self._announcer is not None:
                self._announcer.cancel()
            await self._shutdown()

    # -- bus side -------------------------------------------------------------------------
    async def _on_connect(self) -> None:
        """Announce ``online``, then (after :data:`PRESENCE_SETTLE_S`, in the background) the
        inventory and port states: an agent that turns out to be a duplicate of a running one
        stops before it has told the service anything about "its" host."""
        await self.bus.publish(
            topics.status(self.host), encode(self._status(online=True)), retain=True
        )
        if self._announcer is not None:
            self._announcer.cancel()
        self._announced = False
        self._announcer = asyncio.create_task(self._announce(PRESENCE_SETTLE_S), name="announce")

    async def _receive(self) -> None:
        """bus -> :meth:`_on_message` (plans, peer routes, status, probe targets) in arrival
        order; leaving ends the session cleanly (no last will)."""
        async with contextlib.aclosing(self.bus.messages()) as messages:
            async for message in messages:
                await self._on_message(message)

    # -- monitor side ---------------------------------------------------------------------
    async def _handle(self, out: MonitorOutput) -> None:
        """Run the core's effects of one monitor output; a fast path's neighbour flush runs
        beside the events' publishes (each waits for the broker's PUBACK) and the files,
        awaited at the end (the peers' reroute starts from the states: a flush must not hold
        them back; the first TCP retransmission it clears the way for comes 20-200 ms later)."""
        flushes: list[asyncio.Task[None]] = []
        try:
            for effect in self.core.observe(out):
                if isinstance(effect, FlushNeighbours) and effect.background:
                    flush = asyncio.create_task(self._flush_neighbours(), name="neighbour-flush")
                    flushes.append(flush)  # fast path -> neighbour flush
                else:
                    await self.execute([effect])
        finally:
            for task in flushes:
                await task

    async def _watch(self) -> None:
        """driver observations -> monitor -> core."""
        async for batch in self.source.watch():
            out = self.monitor.observe(batch, now=time.monotonic(), wall=time.time())
            await self._handle(out)

    async def _timer(self) -> None:
        """monitor deadlines (ScheduleTimer effects) -> monitor.tick -> core."""
        while True:
            self._wake.clear()
            timeout = (
                None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
                continue
            out = self.monitor.tick(now=time.monotonic(), wall=time.time())
            await self._handle(out)


class _Stopped(Exception):
    pass


class DuplicateHostError(DuplicateInstanceError):
    """Another agent with this host name was already running; this one stopped."""


async def run_agent(settings: AgentSettings) -> None:
    """Run an agent until SIGTERM/SIGINT (clean shutdown with the configured policy)."""
    agent = Agent(settings)
    on_stop_signals(agent.stop, process="agent")  # a stop that hangs ends after 10 s, logged
    await agent.run()
