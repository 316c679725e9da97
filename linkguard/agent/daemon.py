"""The agent's wiring module: the one place where its tasks are connected.

Tasks (one asyncio TaskGroup, named): ``watch`` (driver observations -> monitor -> bus +
fast path), ``timer`` (monitor deadlines: hold-down expiry, penalty decay), ``refresh``
(re-publish every port state), ``bus`` (MQTT session; plans and peer routes in,
states/events/acks out), ``hooks`` (job-facing commands, :mod:`linkguard.agent.hooks`) and
``rails-socket`` (:mod:`linkguard.agent.localsub`): both get each change of what jobs see
(:mod:`linkguard.agent.railmap`) after a plan, a fast path or a port event, and the event
loop never waits for them. Plans are handled in arrival order in the bus task; the monitor and
applier are only touched from the event loop, so no locks are needed beyond the applier lock
around kernel changes. A compact plan (``Plan.shared``) is applied expanded with the retained
peer routes (``peers/+``, :func:`~linkguard.models.expand_plan`), again whenever one of them
changes; the ack carries the expanded plan's epoch.

Plans and peer routes are signed by the service (:mod:`linkguard.signing`) when the agent
holds its public key (``service_public_key``): an unsigned, wrongly signed or malformed one is
dropped, counted (``stats.messages_dropped`` by reason) and logged (``message_dropped``) before
it is decoded; what is kept in the state dir is the payload as received, verified again on a
restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import structlog
from pydantic import BaseModel

from linkguard import __version__, topics
from linkguard.agent.applier import Applier, RouteTableLike, atomic_write
from linkguard.agent.hooks import HookRunner
from linkguard.agent.inventory import (
    DiscoveredPort,
    build_inventory,
    pci_root,
    read_host_layout,
    with_layout,
)
from linkguard.agent.localsub import RailMapServer
from linkguard.agent.monitor import MonitorOutput, PortMonitor
from linkguard.agent.railmap import RailChanges, rail_view
from linkguard.bus import Bus, BusMessage, BusSession, Will
from linkguard.config import AgentSettings, ConfigError
from linkguard.drivers.base import PortSource
from linkguard.jobenv import AGENT_LOCK, AgentLock
from linkguard.metrics import AgentMetrics
from linkguard.models import (
    Ack,
    AckResult,
    BadMessage,
    HostInventory,
    HostStatus,
    LinkLayer,
    PeerRoutes,
    Plan,
    PortState,
    PortStatus,
    ProbeReport,
    ProbeTargets,
    decode,
    encode,
    expand_plan,
)
from linkguard.nccl import NcclFiles
from linkguard.presence import DuplicateInstanceError, Me, Verdict, judge
from linkguard.signing import SignatureError, Verifier, unwrap

__all__ = ["Agent", "AgentStats", "DuplicateHostError", "run_agent"]

if TYPE_CHECKING:
    from linkguard.agent.prober import ProbeRunner

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)

#: After connecting, an agent waits this long (s) for a running agent with the same host name
#: to object before it publishes its inventory and port states.
PRESENCE_SETTLE_S = 0.3


@dataclass
class AgentStats:
    """Counters an operator (and the tests) can read."""

    plans_applied: int = 0
    plans_refused: Counter[str] = field(default_factory=Counter)
    messages_dropped: Counter[str] = field(default_factory=Counter)
    fast_paths: int = 0
    states_published: int = 0


def discover(settings: AgentSettings) -> list[DiscoveredPort]:
    """Ports found in sysfs (PCI address, NUMA node, netdev) for inventory building."""
    if settings.driver != "sysfs":
        return []
    from linkguard.drivers.sysfs_ib import discover_hcas

    found = []
    for d in discover_hcas(settings.sysfs_root):
        for p in d.ports:
            found.append(
                DiscoveredPort(
                    hca=d.hca,
                    port=p,
                    link_layer=d.link_layers.get(p),
                    pci_address=d.pci_address,
                    numa_node=d.numa_node,
                    netdev=d.netdevs.get(p),
                )
            )
    return found


def make_source(settings: AgentSettings, inventory: HostInventory) -> PortSource:
    from linkguard.drivers.netlink import NetlinkPort, NetlinkPortSource

    if settings.driver == "sysfs":
        from linkguard.drivers.ethtool_stats import read_ethtool_stats
        from linkguard.drivers.merged import CarrierMergedSource
        from linkguard.drivers.sysfs_ib import SysfsIBSource

        sysfs_ib = SysfsIBSource(
            root=settings.sysfs_root,
            interval_s=settings.poll_interval_ms / 1000,
            ports={h.key for h in inventory.hcas},
            phy_stats=read_ethtool_stats,  # RoCE PHY counters for counter health
        )
        from linkguard.drivers.verbs_events import with_verbs_events

        sysfs = with_verbs_events(  # async events trigger re-reads (polling stays the truth)
            sysfs_ib,
            mode=settings.verbs_events,
            driver=settings.driver,
            sysfs_root=settings.sysfs_root,
            python=settings.verbs_python,
            hcas={h.hca for h in inventory.hcas},
            reader=settings.verbs_reader,
        )
        # RoCE: the netdev's carrier (netlink) is the health signal; sysfs adds the RDMA view.
        roce = [
            NetlinkPort(h.hca, h.port, h.netdev, h.link_layer)
            for h in inventory.hcas
            if h.link_layer == LinkLayer.ETHERNET and h.netdev
        ]
        if not roce:
            return sysfs
        carrier = NetlinkPortSource(
            ports=roce,
            netns=settings.netns,
        )
        return CarrierMergedSource(primary=sysfs, carrier=carrier)
    if settings.driver == "netlink":
        missing = [h.key for h in inventory.hcas if not h.netdev]
        if missing:
            raise ValueError(f"netlink driver needs a netdev for every port; missing: {missing}")
        return NetlinkPortSource(
            # every port has a netdev (checked above)
            ports=[
                NetlinkPort(h.hca, h.port, h.netdev, h.link_layer)
                for h in inventory.hcas
                if h.netdev
            ],
            netns=settings.netns,
        )
    raise ConfigError(
        "driver 'simulated' exists for quickstart and tests only; use sysfs or netlink"
    )


class Agent:
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
        self.settings = settings
        self.host = settings.host
        self.me = Me()
        found = discover(settings) if discovered is None else discovered
        self.inventory = build_inventory(
            settings.host,
            configured=settings.ports,
            discovered=found,
            endpoints=settings.endpoints,
            default_link_layer=(
                LinkLayer.ETHERNET if settings.driver == "netlink" else LinkLayer.INFINIBAND
            ),
        )
        if found and settings.ports:
            seen = {(d.hca, d.port) for d in found}
            missing = [f"{p.hca}/{p.port}" for p in settings.ports if (p.hca, p.port) not in seen]
            if missing:
                log.warning(
                    "configured_ports_not_found",
                    ports=missing,
                    sysfs_root=str(settings.sysfs_root),
                    hint="check ports[].hca; these are reported absent (down)",
                )
        if not self.inventory.hcas:
            log.warning(
                "no_ports",
                host=self.host,
                hint="no HCA ports configured or found; the agent only reports",
            )
        self.rails = {h.key: h.rail for h in self.inventory.hcas}
        #: the service's public key (None: plans are applied unverified); KeyFileError (a
        #: ConfigError) for a key file that cannot be read
        self.verifier: Verifier | None = (
            Verifier.from_file(settings.service_public_key)
            if settings.service_public_key is not None
            else None
        )
        self.require_signed = settings.require_signed_plans
        self._unverified_logged = False  # signed_plan_not_verified said once
        self.source = source if source is not None else make_source(settings, self.inventory)
        if table is None:
            if settings.apply_routes:
                from linkguard.drivers.routes import RouteTable

                table = RouteTable(
                    table=settings.route_table,
                    netns=settings.netns,
                    rule_priority=settings.rule_priority,
                    prefixes=settings.endpoint_prefixes,
                )
            else:
                from linkguard.drivers.simulated import MemoryRouteTable

                table = MemoryRouteTable()
        self.table = table
        self.monitor = PortMonitor(
            host=self.host,
            policy=settings.damping,
            rails=self.rails,
            health=settings.counter_health,
            expected_rates={
                f"{p.hca}/{p.port}": p.expected_rate_gbps
                for p in settings.ports
                if p.expected_rate_gbps is not None
            },
            # a glitched rate stays visible until the next state poll: it must not settle
            rate_settle_s=max(3.0, 2 * settings.poll_interval_ms / 1000),
        )
        self._history_path = settings.state_dir / "damping.json"
        self._restore_history()
        self._health_path = settings.state_dir / "counter_health.json"
        # (counter verdicts, reference rates) last written; None: the file needs a rewrite
        self._health_saved: tuple[dict[str, str], dict[str, float]] | None = None
        #: verdicts of counter_health.json kept as they are while counter health is disabled
        self._health_kept: dict[str, dict[str, object]] = {}
        self._restore_health()
        self.applier = Applier(
            host=self.host,
            table=table,
            netdevs={h.netdev for h in self.inventory.hcas if h.netdev},
            prefixes=settings.endpoint_prefixes,
            rail_map_path=settings.rail_map_path,
            state_dir=settings.state_dir,
            verifier=self.verifier,
            require_signed=self.require_signed,
            route_source=settings.routes.source == "endpoint",
            rto_min_ms=settings.routes.rto_min_ms,
            neighbour_flush=settings.routes.neighbour_flush,
        )
        #: NCCL settings for jobs starting now, next to the rail map (linkguard.nccl)
        self.nccl = NcclFiles(settings.rail_map_path.parent, topology_file=settings.nccl_topo_file)
        self.stats = AgentStats()
        #: what jobs see: changes go to the hooks and the rails socket (linkguard.agent.railmap)
        self.rail_changes = RailChanges(self.host)
        self.hooks = HookRunner(settings.hooks)
        #: per-rail probes toward the service's targets (``probes.enabled``; None: off)
        self.prober: ProbeRunner | None = None
        if settings.probes.enabled:  # scapy (~25 MiB) is imported only then
            from linkguard.agent.prober import ProbeRunner

            self.prober = ProbeRunner(self.host, netns=settings.netns)
        ignored = sorted(settings.probes.model_fields_set - {"enabled"})  # the service's
        if ignored:
            log.warning(
                "probe_settings_ignored",
                keys=ignored,
                why="an agent uses only probes.enabled: mode, port, rate, window and the "
                "localisation thresholds come from the service's targets; set them on the "
                "service",
            )
        self.rails_socket = (
            RailMapServer(
                settings.rails_socket,
                current=lambda: self.rail_changes.current(now=time.time()),
                group=settings.rails_socket_group,
                queue=settings.rails_socket_queue,
            )
            if settings.rails_socket is not None
            else None
        )
        #: Prometheus metrics (its own registry); the exporter runs while :meth:`run` does
        self.metrics = AgentMetrics(self)
        self.last_ack: Ack | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._deadline: float | None = None
        self._stop = asyncio.Event()
        self.duplicate: HostStatus | None = None
        self._announcer: asyncio.Task[None] | None = None
        self._announced = False  # states, events and acks wait for the presence check
        self._cleared_logged = False  # plan_cleared said since the last plan
        self.plan_received: Plan | None = None  # the last plan off the bus (compact or full)
        self.peers: dict[str, PeerRoutes] = {}  # retained peer routes, by peer
        #: the highest leader term seen on a plan or peer routes message taken in hand
        #: (persisted in ``state_dir/term``): anything of a lower term is a deposed
        #: leader's and is refused (``deposed_leader``)
        self.term = 0
        self._term_path = settings.state_dir / "term"
        self.bus = bus_factory(
            **settings.bus.connection(),
            client_id=f"linkguard-agent-{self.host}-{self.me.instance}",
            subscriptions=[
                topics.plan(self.host),
                topics.status(self.host),
                # QoS 0: each is retained and replaces the last, so a delivery lost with a
                # connection comes back as the retained copy on the resubscribe; saves every
                # host a PUBACK per peer change (256 per host link event at 256 hosts)
                (topics.all_peer_routes(), 0),
                *([topics.probe_targets(self.host)] if settings.probes.enabled else []),
            ],
            handler=self._on_message,
            on_connect=self._on_connect,
            will=Will(topics.status(self.host), encode(self._status(online=False, reason="lost"))),
        )

    def _status(
        self, *, online: bool, reason: Literal["stopped", "lost"] | None = None
    ) -> HostStatus:
        return HostStatus(
            host=self.host,
            online=online,
            reason=reason,
            at=time.time(),
            version=__version__,
            instance=self.me.instance,
            started_at=self.me.started_at,
        )

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        log.info(
            "agent_starting",
            host=self.host,
            driver=self.settings.driver,
            ports=[f"{h.key}=rail{h.rail}" for h in self.inventory.hcas],
            table=self.settings.route_table,
            netns=self.settings.netns,
        )
        if self.verifier is None:
            # a warning where plans steer kernel routes; simulated agents (in-memory tables:
            # quickstart, simulations) say it at info
            (log.warning if self.settings.apply_routes else log.info)(
                "plans_not_verified",
                host=self.host,
                hint="set service_public_key (linkguard keys generate): without it a forged "
                "plan on the bus is applied",
            )
        elif not self.require_signed:
            log.warning(
                "unsigned_plans_accepted",
                key_id=self.verifier.key_id,
                hint="require_signed_plans is false: unsigned plans are applied (key roll-out)",
            )
        else:
            log.info("plans_verified", key_id=self.verifier.key_id)
        async with contextlib.AsyncExitStack() as stack:
            lock = self._hold_agent_lock()
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

    def _hold_agent_lock(self) -> AgentLock | None:
        """``agent.lock`` next to the NCCL files, held while the agent runs: ``linkguard exec``
        (:mod:`linkguard.jobenv`) takes files nobody holds it for as a stale plan. A lock that
        cannot be taken is logged; the agent runs on."""
        directory = self.settings.rail_map_path.parent
        try:
            return AgentLock(directory)
        except OSError as exc:
            log.warning(
                "agent_lock_unavailable",
                path=str(directory / AGENT_LOCK),
                error=str(exc),
                hint="linkguard exec refuses jobs here (no current plan) without it",
            )
            return None

    async def _read_layout(self) -> None:
        """Add the host layout (PCIe switch per HCA and GPU) to the inventory before it is
        announced: read once, off the event loop, from ``nccl_topo_file`` or the PCI sysfs
        tree (not with the simulated driver). Never fatal: without it the inventory has no
        switch ids (the service then ranks alternates by NUMA node), said once in the log."""
        s = self.settings
        sysfs = pci_root(s.sysfs_root) if s.driver != "simulated" else None
        why: str | None
        try:
            layout = await asyncio.to_thread(
                read_host_layout, nccl_topo_file=s.nccl_topo_file, sysfs=sysfs
            )
        except Exception as exc:  # LayoutError, or anything unforeseen: never fatal
            layout, why = None, f"{type(exc).__name__}: {exc}"
        else:
            self.inventory, why = with_layout(self.inventory, layout)
        if why is not None:
            # a configured file that fails: warning; a host without a PCI tree: info;
            # the simulated driver (no layout source at all): debug
            level = (
                log.warning
                if s.nccl_topo_file is not None
                else (log.info if sysfs is not None else log.debug)
            )
            level("host_layout_unavailable", host=self.host, reason=why[:500])
            return
        log.info(
            "host_layout",
            host=self.host,
            source=layout.source,
            gpu_pcie_switch=self.inventory.gpu_pcie_switch,
            hca_pcie_switch={h.key: h.pcie_switch for h in self.inventory.hcas},
            problems=len(layout.problems),
        )

    async def _run(self) -> None:
        await self._read_layout()
        async with self._lock:
            await self.applier.start()
        if self.applier.restored is not None:  # retained copies of these change nothing,
            # and older ones (replays) are stale against them
            self.plan_received, peers = self.applier.restored
            self.peers = dict(peers)
        self._restore_term()
        if self.applier.plan is not None:  # announced on connect: replaces a stale one
            errors = self.applier.last_result.errors if self.applier.last_result else []
            self.last_ack = Ack(
                host=self.host,
                epoch=self.applier.plan.epoch,
                result=AckResult.FAILED if errors else AckResult.APPLIED,
                error="; ".join(f"{d}: {m}" for d, m in errors)[:2000] or None,
                applied_at=time.time(),
            )
        if self.applier.plan is not None:
            self._rail_change("start")
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.bus.run(), name="bus")
                tg.create_task(self._watch(), name="watch")
                tg.create_task(self._timer(), name="timer")
                tg.create_task(self._refresh(), name="refresh")
                tg.create_task(self._expect_plan(), name="expect-plan")
                tg.create_task(self.hooks.run(), name="hooks")
                if self.rails_socket is not None:
                    tg.create_task(self.rails_socket.serve(), name="rails-socket")
                if self.prober is not None:
                    tg.create_task(self.prober.run(self._publish_probes), name="probes")
                await self._stop.wait()
                if self.duplicate is None:  # never mark the other instance offline
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.bus.publish(
                                topics.status(self.host),
                                encode(self._status(online=False, reason="stopped")),
                                retain=True,
                            ),
                            2,
                        )
                raise _Stopped
        except* _Stopped:
            pass
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        if self._announcer is not None:
            self._announcer.cancel()
        # a duplicate applied another machine's plans: never leave those routes behind
        if self.settings.shutdown_policy == "withdraw" or self.duplicate is not None:
            async with self._lock:
                await self.applier.withdraw()
            log.info("agent_withdrew_routes", table=self.settings.route_table)
        log.info("agent_stopped", host=self.host)

    def _restore_history(self) -> None:
        """Flap history of the previous run: a restart must not bypass a hold-down."""
        try:
            doc = json.loads(self._history_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("damping_history_unreadable", path=str(self._history_path), error=str(exc))
            return
        if not isinstance(doc, dict):
            log.warning(
                "damping_history_unreadable",
                path=str(self._history_path),
                error="not a JSON object",
            )
            return
        restored = self.monitor.restore(doc, now=time.monotonic(), wall=time.time())
        if restored:
            log.info("damping_history_restored", ports=restored)

    def _restore_health(self) -> None:
        """Counter-health verdicts and reference rates of the previous run
        (``state_dir/counter_health.json``, ``{"version": 1, "ports": {"hca/port": {"reason":
        ..., "since": <Unix s>}}, "rates": {"hca/port": <Gb/s>}}``; ``rates`` may be absent): a
        restart must not clear a port degraded on its error counters, nor make a port that
        retrained to a lower rate look healthy at that rate. The clear timer restarts at load
        (``clear_after_s`` of clean readings after the restart, see
        :meth:`PortMonitor.restore_health`). A missing file: nothing to restore; an unreadable
        one is logged and the agent starts clean; a corrupt or unknown-version one (a newer
        agent's) is also moved aside to ``counter_health.json.bad`` before this agent writes
        its own (``counter_health_state_moved_aside``). With ``counter_health.enabled`` false
        the file's verdicts are kept in it as they are (``counter_health_verdicts_kept``), for
        when counter health is on again."""
        try:
            doc = json.loads(self._health_path.read_text())
        except FileNotFoundError:
            self._health_saved = ({}, {})  # nothing to write until a port degrades or a
            # reference rate is learnt
            return
        except ValueError as exc:  # not JSON, not UTF-8
            log.warning(
                "counter_health_state_unreadable", path=str(self._health_path), error=str(exc)
            )
            self._move_health_aside()
            return
        except OSError as exc:  # EIO, EACCES: the file may be fine; it is rewritten as is
            log.warning(
                "counter_health_state_unreadable", path=str(self._health_path), error=str(exc)
            )
            return
        version = doc.get("version") if isinstance(doc, dict) else None
        ports = doc.get("ports") if isinstance(doc, dict) else None
        rates = doc.get("rates", {}) if isinstance(doc, dict) else None
        known = version == _HEALTH_STATE_VERSION and not isinstance(version, bool)  # true == 1
        if not known or not isinstance(ports, dict) or not isinstance(rates, dict):
            error = (
                f"unknown version {version!r} (this agent reads {_HEALTH_STATE_VERSION})"
                if isinstance(doc, dict) and not known
                else "not a JSON object with a ports object (and a rates object, if any)"
            )
            log.warning(
                "counter_health_state_unreadable", path=str(self._health_path), error=error[:200]
            )
            self._move_health_aside()
            return
        restored = self.monitor.restore_health(ports, now=time.monotonic(), wall=time.time())
        if restored:
            log.info("counter_health_restored", ports=restored)
        if not self.settings.counter_health.enabled and ports:
            self._health_kept = {
                k: v
                for k, v in ports.items()
                if isinstance(v, dict) and isinstance(v.get("reason"), str)
            }
            restored = list(self._health_kept)  # kept: not rewritten for them
            log.info(
                "counter_health_verdicts_kept",
                ports=sorted(self._health_kept)[:64],
                why="counter_health is disabled: the verdicts are kept in the file, not "
                "applied, and restored when it is enabled again",
            )
        rates_restored = self.monitor.restore_reference_rates(rates)
        if rates_restored:
            log.info("reference_rates_restored", rates={k: rates[k] for k in rates_restored})
        if len(restored) == len(ports) and len(rates_restored) == len(rates):
            # else rewrite the file without what was ignored
            self._health_saved = (
                {k: str(ports[k]["reason"]) for k in restored},
                {k: float(rates[k]) for k in rates_restored},
            )

    def _move_health_aside(self) -> None:
        """Rename a counter_health.json this agent cannot read to ``.bad`` (replacing an older
        one), so the next write loses nothing a person (or a newer agent) may want."""
        aside = self._health_path.with_name(self._health_path.name + ".bad")
        try:
            os.replace(self._health_path, aside)
        except OSError as exc:
            log.warning(
                "counter_health_state_not_moved", path=str(self._health_path), error=str(exc)
            )
            return
        log.warning("counter_health_state_moved_aside", path=str(self._health_path), to=str(aside))

    def _save_health(self) -> None:
        """Write the counter-health verdicts and reference rates when they changed since the
        last write (with counter health disabled, the verdicts read at start as they were)."""
        ports = {
            **self._health_kept,
            **self.monitor.health_history(now=time.monotonic(), wall=time.time()),
        }
        rates = self.monitor.reference_rates()
        verdicts = ({k: str(v["reason"]) for k, v in ports.items()}, rates)
        if verdicts == self._health_saved:
            return
        doc = {"version": _HEALTH_STATE_VERSION, "ports": ports, "rates": rates}
        try:
            atomic_write(self._health_path, json.dumps(doc), mode=0o600)
        except OSError as exc:
            log.warning(
                "counter_health_state_not_saved", path=str(self._health_path), error=str(exc)
            )
            return
        self._health_saved = verdicts

    def _restore_term(self) -> None:
        """The highest term of the previous run: its file, or the restored plan's and peer
        routes' (whichever is higher). An unreadable file counts as 0 (logged)."""
        try:
            self.term = int(self._term_path.read_text().strip())
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("term_unreadable", path=str(self._term_path), error=str(exc)[:200])
        taken = [self.plan_received, *self.peers.values()]
        self.term = max([self.term, *(m.term for m in taken if m is not None)])

    def _deposed(self, msg: BusMessage, term: int, epoch: int) -> bool:
        """True (counted in ``plans_refused["deposed_leader"]``, logged, never applied nor
        acked) when ``term`` is below the highest seen: a deposed leader's message. Else a
        higher ``term`` becomes the highest seen (persisted)."""
        if term < self.term:
            self.stats.plans_refused["deposed_leader"] += 1
            log.warning(
                "plan_refused",
                topic=msg.topic,
                epoch=epoch,
                reason="deposed_leader",
                detail=f"term {term} < {self.term} seen: a deposed topology service's (if this "
                "service is meant to lead, e.g. election switched off or etcd's data reset, "
                f"remove {self.settings.state_dir / 'term'} on the hosts)",
            )
            return True
        if term > self.term:
            log.info("leader_term_seen", term=term, previous=self.term, topic=msg.topic)
            self.term = term
            try:
                atomic_write(self._term_path, f"{term}\n", mode=0o600)
            except OSError as exc:
                log.warning("term_not_saved", path=str(self._term_path), error=str(exc)[:200])
        return False

    def _save_history(self) -> None:
        try:
            atomic_write(
                self._history_path,
                json.dumps(self.monitor.history(now=time.monotonic(), wall=time.time())),
                mode=0o600,
            )
        except OSError as exc:
            log.warning("damping_history_not_saved", path=str(self._history_path), error=str(exc))

    async def _expect_plan(self, after_s: float = 30.0) -> None:
        """Warn (once) when no plan arrived: the host is unprotected until one does."""
        await self.bus.connected.wait()
        await asyncio.sleep(after_s)
        if self.applier.plan is None:
            log.warning(
                "no_plan_yet",
                host=self.host,
                waited_s=after_s,
                hint="is this host name in the service's fabric? is the service up?",
            )

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

    async def _announce(self, delay_s: float = 0.0) -> None:
        """Publish everything the service should know of this host, from current state."""
        if delay_s:
            await asyncio.sleep(delay_s)
        if self.duplicate is not None:
            return
        self._announced = True
        await self.bus.publish(topics.inventory(self.host), encode(self.inventory), retain=True)
        for st in self.monitor.snapshot(wall=time.time()):
            await self._publish_state(st)
        if self.last_ack is not None:
            await self.bus.publish(topics.ack(self.host), encode(self.last_ack), retain=True)

    async def _on_status(self, msg: BusMessage) -> None:
        try:
            seen = decode(HostStatus, msg.payload, topic=msg.topic, expect_host=self.host)
        except BadMessage as exc:
            self._drop(msg, exc.reason, exc.detail)
            return
        verdict = judge(self.me, seen, retained=msg.retain)
        if verdict == Verdict.IGNORE:
            return
        if verdict in (Verdict.YIELD, Verdict.HOLD):
            log.error(
                "duplicate_host",
                host=self.host,
                other_instance=seen.instance,
                action="stopping: the other agent started first"
                if verdict == Verdict.YIELD
                else "keeping this host: started first; the other must stop",
            )
        if verdict == Verdict.YIELD:
            self.duplicate = seen
            self.stop()
            return
        await self.bus.publish(
            topics.status(self.host), encode(self._status(online=True)), retain=True
        )
        # whatever the other published (inventory, port states) is now wrong: put ours back
        await self._announce()

    async def _on_message(self, msg: BusMessage) -> None:
        parsed = topics.parse(msg.topic)
        if parsed is not None and parsed.kind == "status" and parsed.host == self.host:
            await self._on_status(msg)
            return
        if parsed is not None and parsed.kind == "peers":
            await self._on_peer_routes(msg, parsed.host)
            return
        if parsed is not None and parsed.kind == "probe_targets" and parsed.host == self.host:
            self._on_probe_targets(msg)
            return
        if parsed is None or parsed.kind != "plan" or parsed.host != self.host:
            self.stats.messages_dropped["unexpected_topic"] += 1
            log.warning("message_dropped", topic=msg.topic, reason="unexpected_topic")
            return
        if not msg.payload:
            self._on_plan_cleared()
            return
        self._cleared_logged = False
        plan = self._decode(Plan, msg, self.host)
        if plan is None or self._deposed(msg, plan.term, plan.epoch):
            return
        # older than the plan in hand (a replay, or a late retained copy): never taken in hand.
        # (term, epoch): a new leader's epochs count above any of a lower term
        got = self.plan_received
        have = got.epoch if got is not None else None
        older = got is not None and (plan.term, plan.epoch) < (got.term, got.epoch)
        if have is not None and older and plan.shared is not None:
            self._stale(msg, plan.epoch, have)
            return
        if have is not None and older:  # refused as the applier refuses it
            self.stats.plans_refused["stale_epoch"] += 1
            log.warning(
                "plan_refused",
                epoch=plan.epoch,
                reason="stale_epoch",
                detail=f"epoch {plan.epoch} < received {have}",
            )
            return
        if plan.shared is not None:
            changed = plan != self.plan_received
            self.plan_received = plan
            # persisted (as received: what the applier expands on a restart) once it applies
            if await self._apply_expanded() and changed:
                atomic_write(self.applier.plan_path, msg.payload, mode=0o600)
            return
        self.plan_received = plan
        applied = self.applier.plan
        if applied is not None and (plan.term, plan.epoch) == (applied.term, applied.epoch):
            if plan.same_assignments(applied):
                log.debug("plan_already_applied", epoch=plan.epoch)
                return
            # the same epoch, other content: an expansion of the compact plan this one
            # replaces was applied with it (retained copies arrive in any order): apply
            await self._apply(plan, same_epoch=True, raw=msg.payload)
            return
        await self._apply(plan, raw=msg.payload)

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
            self._drop(msg, exc.reason, exc.detail)
            return
        self.prober.set_targets(targets)

    async def _publish_probes(self, report: ProbeReport) -> None:
        await self.bus.publish(topics.probe_report(self.host), encode(report), retain=False)

    def _drop(self, msg: BusMessage, reason: str, detail: str) -> None:
        """Count and log a message that is not taken (``message_dropped``)."""
        self.stats.messages_dropped[reason] += 1
        log.warning(
            "message_dropped",
            topic=msg.topic,
            reason=reason,
            detail=detail[:300],
            bytes=len(msg.payload),
        )

    def _decode(self, model: type[M], msg: BusMessage, host: str) -> M | None:
        """``msg`` (signed as :meth:`_open` requires) validated as ``model`` for ``host``;
        None (logged, counted) when bad."""
        body = self._open(msg)
        if body is None:
            return None
        try:
            return decode(
                model,
                body,
                topic=msg.topic,
                expect_host=host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except BadMessage as exc:
            self._drop(msg, exc.reason, exc.detail)
            return None

    def _open(self, msg: BusMessage) -> bytes | None:
        """The message inside ``msg.payload``: with the service's key, a signed envelope
        whose signature checks out (or, with ``require_signed_plans`` false, a plain
        message); without one, a plain message or an envelope's body (unverified, said once
        in the log). None (logged as ``message_dropped``, counted by reason) when refused."""
        size = len(msg.payload)
        limit = self.settings.bus.max_message_bytes
        if size > limit:  # before parsing anything
            self.stats.messages_dropped["oversized"] += 1
            log.warning(
                "message_dropped", topic=msg.topic, reason="oversized", bytes=size, limit=limit
            )
            return None
        try:
            opened = unwrap(msg.payload, self.verifier, require=self.require_signed)
        except SignatureError as exc:
            self._drop(msg, exc.reason, exc.detail)
            return None
        if opened.signed and not opened.verified and not self._unverified_logged:
            self._unverified_logged = True
            log.warning(
                "signed_plan_not_verified",
                topic=msg.topic,
                hint="the service signs its plans but this agent has no service_public_key: "
                "applied without checking the signature",
            )
        return opened.body

    async def _on_peer_routes(self, msg: BusMessage, peer: str) -> None:
        """``peers/<peer>``: keep the newest; re-apply a compact plan with it. A zero-length
        payload (the service deleted a stale one) empties it (its epoch stays counted)."""
        if not msg.payload:
            if self.verifier is not None and self.require_signed:
                # a deletion cannot be signed: routes change only with a signed message (the
                # service publishes empty signed peer routes before it deletes them)
                log.info("peer_routes_deletion_ignored", topic=msg.topic, reason="unsigned")
                return
            old = self.peers.get(peer)
            if old is not None and old.classes:  # keep its epoch: the acked one stays the same
                self.peers[peer] = old.model_copy(update={"classes": [], "modulus": 1})
                atomic_write(self._peer_path(peer), encode(self.peers[peer]), mode=0o600)
                await self._apply_expanded()
            return
        pr = self._decode(PeerRoutes, msg, peer)
        if pr is None or self._deposed(msg, pr.term, pr.epoch):
            return
        old = self.peers.get(peer)
        if old is not None and (old.term, old.epoch) >= (pr.term, pr.epoch):
            self._stale(msg, pr.epoch, old.epoch)
            return
        outside = [e for e in pr.endpoints if not self._in_scope(e)]
        if outside:
            detail = f"endpoints {outside[:4]} outside the configured endpoint prefixes"
            self._drop(msg, "out_of_scope", detail)
            return
        # kept (and persisted) only once it is known to apply: a refused one changes nothing,
        # and the ones that follow it are judged against what was kept
        candidate = {**self.peers, peer: pr}
        if await self._apply_expanded(candidate):
            self.peers = candidate
            atomic_write(self._peer_path(peer), msg.payload, mode=0o600)  # as received

    def _in_scope(self, endpoint: str) -> bool:
        prefixes = self.applier.prefixes
        return not prefixes or any(ipaddress.IPv4Address(endpoint) in p for p in prefixes)

    def _stale(self, msg: BusMessage, epoch: int, have: int) -> None:
        """A message no newer than the one in hand: a redelivery of the same epoch is normal
        (every reconnect); an older one is counted and logged."""
        if epoch == have:
            log.debug("message_redelivered", topic=msg.topic, epoch=epoch)
            return
        self.stats.messages_dropped["stale_epoch"] += 1
        log.info("message_dropped", topic=msg.topic, reason="stale_epoch", epoch=epoch, have=have)

    def _peer_path(self, peer: str) -> Path:
        return self.applier.peers_dir / f"{peer}.json"

    async def _apply_expanded(self, peers: dict[str, PeerRoutes] | None = None) -> bool:
        """Apply the compact plan in hand expanded with ``peers`` (default: the peer routes in
        hand), unless that is what is applied already. An older expansion than the applied
        plan is left alone (a restart: the retained plan arrives before the peer routes that
        the last applied plan had); one of the same epoch that differs is applied (retained
        peer routes arrive in any order). False when the expansion was refused."""
        plan = self.plan_received
        if plan is None or plan.shared is None:
            return True
        try:
            full = expand_plan(plan, self.peers if peers is None else peers)
        except ValueError as exc:
            self.stats.plans_refused["invalid"] += 1
            log.warning("plan_refused", epoch=plan.epoch, reason="invalid", detail=str(exc))
            await self._send_ack(
                Ack(
                    host=self.host,
                    epoch=plan.epoch,
                    result=AckResult.REFUSED,
                    error=f"invalid: {exc}"[:2000],
                    applied_at=time.time(),
                )
            )
            return False
        applied = self.applier.plan
        mine, theirs = (full.term, full.epoch), (applied.term, applied.epoch) if applied else None
        if theirs is not None and (
            mine < theirs or (mine == theirs and full.same_assignments(applied))
        ):
            return True
        return await self._apply(full, same_epoch=True, persist=False)

    async def _apply(
        self,
        plan: Plan,
        *,
        same_epoch: bool = False,
        persist: bool = True,
        raw: bytes | None = None,
    ) -> bool:
        """Apply ``plan`` and ack it; False when it was refused. ``raw``: the payload
        ``plan`` came in, persisted as received once the plan is taken (instead of the
        applier's own JSON of it, which could not carry the signature)."""
        async with self._lock:
            ack = await self.applier.apply(
                plan, same_epoch=same_epoch, persist=persist and raw is None
            )
            if raw is not None and persist and ack.result != AckResult.REFUSED:
                atomic_write(self.applier.plan_path, raw, mode=0o600)
        self.metrics.observe_ack(ack)
        if ack.result == AckResult.REFUSED:
            reason = (ack.error or "").split(":", 1)[0]
            self.stats.plans_refused[reason] += 1
            if reason in ("stale_epoch", "deposed_leader"):
                return False  # an old retained plan; nothing to report to the service
        else:
            self.stats.plans_applied += 1
        await self._send_ack(ack)
        if ack.result != AckResult.REFUSED:
            # after the ack: never delays it; the files before the change goes out
            self._render_nccl()
            self._rail_change("plan")
            await self._flush_neighbours()
        return ack.result != AckResult.REFUSED

    def _render_nccl(self) -> None:
        """Rewrite the NCCL files from the applied plan and the ports' states (only what
        changed; a failure is logged by :class:`~linkguard.nccl.NcclFiles`, never raised)."""
        states = [self.monitor.state(h.key) for h in self.inventory.hcas]
        self.nccl.update(self.inventory, [s for s in states if s is not None], self.applier.plan)

    def _on_plan_cleared(self) -> None:
        """A zero-length payload on the plan topic: MQTT's deletion of the retained plan (the
        service clears plans of hosts its fabric does not list). No plan, not a bad message:
        the routes applied so far stay. Logged once until a plan arrives again."""
        if not self._cleared_logged:
            self._cleared_logged = True
            log.warning(
                "plan_cleared",
                host=self.host,
                applied_epoch=self.applier.applied_epoch,
                action="keeping the current routes",
                hint="is this host name in the service's fabric?",
            )

    async def _send_ack(self, ack: Ack) -> None:
        self.last_ack = ack
        if self._announced:  # else _announce() publishes it
            await self.bus.publish(topics.ack(self.host), encode(ack), retain=True)

    async def _publish_state(self, st: PortState) -> None:
        if not self._announced:  # _announce() publishes the current snapshot
            return
        self.stats.states_published += 1
        await self.bus.publish(
            topics.port_state(self.host, st.hca, st.port), encode(st), retain=True
        )

    # -- monitor side ---------------------------------------------------------------------
    async def _flush_neighbours(self) -> None:
        """The neighbour entries the last route changes left stale (the applier's
        ``flush_stale``), under the applier's lock: the netlink socket takes one request at
        a time."""
        async with self._lock:
            await self.applier.flush_stale()

    async def _handle(self, out: MonitorOutput) -> None:
        # fast path -> neighbour flush: runs beside the events' publishes (each waits for the
        # broker's PUBACK) and the files, awaited at the end
        flushes: list[asyncio.Task[None]] = []
        try:
            await self._handle_events(out, flushes)
        finally:
            for task in flushes:
                await task

    async def _handle_events(self, out: MonitorOutput, flushes: list[asyncio.Task[None]]) -> None:
        """Act on the monitor's output: the fast path of every port that went down, then the
        states and events on the bus; the fast paths' neighbour flush starts into ``flushes``
        once the states are out (the peers' reroute starts from them: a flush must not hold
        them back; the first TCP retransmission it clears the way for comes 20-200 ms later)."""
        self.metrics.observe_events(out.events)
        fast_path = False
        for ev in out.events:
            key = f"{ev.hca}/{ev.port}"
            # DEGRADED -> DOWN too: the service may not have drained it yet (UP -> DEGRADED
            # itself is no emergency: no fast path, the service re-plans)
            if ev.current == PortStatus.DOWN and ev.previous in (
                PortStatus.UP,
                PortStatus.UNKNOWN,
                PortStatus.DEGRADED,
            ):
                async with self._lock:
                    ack = await self.applier.port_down(key)
                fast_path = True
                if ack is not None:
                    self.stats.fast_paths += 1
                    self.metrics.observe_ack(ack)
                    log.info(
                        "fast_path_applied",
                        port=key,
                        epoch=ack.epoch,
                        apply_ms=round(ack.apply_ms or 0, 2),
                    )
                    await self._send_ack(ack)
                    self._rail_change("fast_path")
            elif ev.current == PortStatus.UP:
                self.applier.port_up(key)
        for st in out.states:
            await self._publish_state(st)
        if fast_path:
            flushes.append(asyncio.create_task(self._flush_neighbours(), name="neighbour-flush"))
        for ev in out.events:
            log.info(
                "port_event",
                port=f"{ev.hca}/{ev.port}",
                rail=ev.rail,
                previous=ev.previous.value,
                current=ev.current.value,
                reason=ev.reason,
            )
            if self._announced:
                await self.bus.publish(topics.events(self.host), encode(ev), retain=False)
        if out.events:
            self._save_history()
            self._rail_change("port_event")
        self._save_health()  # written only when a verdict changed (even on a down port)
        if out.events or out.states:
            self._render_nccl()
        self._deadline = out.next_deadline
        self._wake.set()

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

    async def _watch(self) -> None:
        async for batch in self.source.watch():
            out = self.monitor.observe(batch, now=time.monotonic(), wall=time.time())
            await self._handle(out)

    async def _timer(self) -> None:
        while True:
            self._wake.clear()
            timeout = (
                None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            out = self.monitor.tick(now=time.monotonic(), wall=time.time())
            await self._handle(out)

    async def _refresh(self) -> None:
        """Re-publish every port state each ``refresh_interval_s``, +-10 % at random: agents
        started together (a fleet reboot) do not refresh in one burst on the broker."""
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s * random.uniform(0.9, 1.1))
            for st in self.monitor.snapshot(wall=time.time()):
                await self._publish_state(st)


#: format of ``state_dir/counter_health.json`` (:meth:`Agent._restore_health`)
_HEALTH_STATE_VERSION = 1


class _Stopped(Exception):
    pass


class DuplicateHostError(DuplicateInstanceError):
    """Another agent with this host name was already running; this one stopped."""


async def run_agent(settings: AgentSettings) -> None:
    """Run an agent until SIGTERM/SIGINT (clean shutdown with the configured policy)."""
    agent = Agent(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()
