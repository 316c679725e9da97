"""The agent's parts, built from its settings: ports found, the port source, the route
table, the port monitor, the host layout, the agent lock.

Consumes: :class:`~linkguard.config.AgentSettings` and the host inventory. Produces: the
objects the wiring (:mod:`linkguard.agent.daemon`) connects; logs what it had to work
around (configured ports not found, ignored probe settings, an unverified plan source).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from linkguard import topics
from linkguard.agent.applier import Applier, RouteTableLike
from linkguard.agent.core import AgentCore
from linkguard.agent.inbox import Inbox
from linkguard.agent.inventory import (
    DiscoveredPort,
    build_inventory,
    is_bond,
    lag_problems,
    pci_root,
    read_host_layout,
    with_layout,
)
from linkguard.agent.localsub import RailMapServer
from linkguard.agent.monitor import PortMonitor
from linkguard.config import AgentSettings, ConfigError
from linkguard.drivers.base import PortSource
from linkguard.jobenv import AGENT_LOCK, AgentLock
from linkguard.models import HostInventory, LinkLayer
from linkguard.signing import Verifier

if TYPE_CHECKING:
    from linkguard.agent.prober import ProbeRunner
    from linkguard.drivers.netlink import NetlinkPort

__all__ = [
    "carrier_ports",
    "discover",
    "hold_agent_lock",
    "log_plan_verification",
    "make_applier",
    "make_core",
    "make_inbox",
    "make_inventory",
    "make_monitor",
    "make_prober",
    "make_rails_socket",
    "make_source",
    "make_table",
    "make_verifier",
    "read_layout",
    "subscriptions",
    "warn_ignored",
]

log = structlog.get_logger(__name__)


def discover(settings: AgentSettings) -> list[DiscoveredPort]:
    """Ports found in sysfs (PCI address, NUMA node, netdev, and the netdev's bond links from
    the net class next to the IB class: :mod:`linkguard.drivers.netclass`) for inventory
    building."""
    if settings.driver != "sysfs":
        return []
    from linkguard.drivers.netclass import NetdevLinks, net_root, read_netdev_links
    from linkguard.drivers.sysfs_ib import discover_hcas

    net = net_root(settings.sysfs_root)
    found = []
    for d in discover_hcas(settings.sysfs_root):
        for p in d.ports:
            netdev = d.netdevs.get(p)
            links = (
                read_netdev_links(net, netdev)
                if net is not None and netdev is not None
                else NetdevLinks()
            )
            for err in links.errors:
                log.warning("sysfs_bad_value", error=err, root=str(net))
            found.append(
                DiscoveredPort(
                    hca=d.hca,
                    port=p,
                    link_layer=d.link_layers.get(p),
                    pci_address=d.pci_address,
                    numa_node=d.numa_node,
                    netdev=netdev,
                    bond_netdev=links.bond,
                    members=links.members,
                    master=links.master,
                )
            )
    return found


def carrier_ports(
    inventory: HostInventory, discovered: Sequence[DiscoveredPort] = ()
) -> list[NetlinkPort]:
    """The ports whose netdev carrier is watched next to sysfs: every port with a netdev
    (RoCE: the health signal; InfiniBand: its IPoIB netdev's carrier and carrier_changes are
    evidence, :mod:`linkguard.agent.linkkinds`), a bond device with its member netdevs."""
    from linkguard.drivers.netlink import NetlinkPort

    members = {(d.hca, d.port): d.members for d in discovered if is_bond(d)}
    return [
        NetlinkPort(h.hca, h.port, h.netdev, h.link_layer, members=members.get((h.hca, h.port), ()))
        for h in inventory.hcas
        if h.netdev
    ]


def make_source(
    settings: AgentSettings,
    inventory: HostInventory,
    discovered: Sequence[DiscoveredPort] = (),
) -> PortSource:
    """The port source: sysfs (with verbs events) merged with the netdev carrier of every
    port that has a netdev (:func:`carrier_ports`; ``discovered`` gives the bond members),
    or netlink alone."""
    from linkguard.drivers.netlink import NetlinkPortSource

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
            mode=settings.verbs.events,
            driver=settings.driver,
            sysfs_root=settings.sysfs_root,
            python=settings.verbs.python,
            hcas={h.hca for h in inventory.hcas},
            reader=settings.verbs.reader,
        )
        # RoCE: the netdev's carrier (netlink) is the health signal; sysfs adds the RDMA view.
        # InfiniBand with an IPoIB netdev: its carrier and carrier_changes are evidence.
        watched = carrier_ports(inventory, discovered)
        if not watched:
            return sysfs
        carrier = NetlinkPortSource(ports=watched, netns=settings.netns)
        return CarrierMergedSource(primary=sysfs, carrier=carrier)
    if settings.driver == "netlink":
        missing = [h.key for h in inventory.hcas if not h.netdev]
        if missing:
            raise ValueError(f"netlink driver needs a netdev for every port; missing: {missing}")
        # every port has a netdev (checked above)
        return NetlinkPortSource(ports=carrier_ports(inventory, discovered), netns=settings.netns)
    raise ConfigError(
        "driver 'simulated' exists for quickstart and tests only; use sysfs or netlink"
    )


def warn_ignored(
    settings: AgentSettings, found: Sequence[DiscoveredPort], inventory: HostInventory
) -> None:
    """Log configured ports sysfs does not have, an agent without ports, and the probe
    settings that are the service's."""
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
    if not inventory.hcas:
        log.warning(
            "no_ports",
            host=settings.host,
            hint="no HCA ports configured or found; the agent only reports",
        )
    ignored = sorted(settings.probes.model_fields_set - {"enabled"})  # the service's
    if ignored:
        log.warning(
            "probe_settings_ignored",
            keys=ignored,
            why="an agent uses only probes.enabled: mode, port, rate, window and the "
            "localisation thresholds come from the service's targets; set them on the "
            "service",
        )


def make_table(settings: AgentSettings) -> RouteTableLike:
    """linkguard's kernel routing table (``routes.apply``), else an in-memory one."""
    if settings.routes.apply:
        from linkguard.drivers.routes import RouteTable

        return RouteTable(
            table=settings.routes.table,
            netns=settings.netns,
            rule_priority=settings.routes.rule_priority,
            prefixes=settings.endpoint_prefixes,
        )
    from linkguard.drivers.simulated import MemoryRouteTable

    return MemoryRouteTable()


def make_monitor(settings: AgentSettings, rails: dict[str, int]) -> PortMonitor:
    """The port monitor with the configured damping, counter health and expected rates."""
    return PortMonitor(
        host=settings.host,
        policy=settings.damping,
        rails=rails,
        health=settings.counter_health,
        expected_rates={
            f"{p.hca}/{p.port}": p.expected_rate_gbps
            for p in settings.ports
            if p.expected_rate_gbps is not None
        },
        # a glitched rate stays visible until the next state poll: it must not settle
        rate_settle_s=max(3.0, 2 * settings.poll_interval_ms / 1000),
    )


def log_plan_verification(settings: AgentSettings, verifier: Verifier | None) -> None:
    """Say at start whether plans are verified (a warning where they are not and steer
    kernel routes)."""
    if verifier is None:
        # a warning where plans steer kernel routes; simulated agents (in-memory tables:
        # quickstart, simulations) say it at info
        (log.warning if settings.routes.apply else log.info)(
            "plans_not_verified",
            host=settings.host,
            hint="set service_public_key (linkguard keys generate): without it a forged "
            "plan on the bus is applied",
        )
    elif not settings.require_signed_plans:
        log.warning(
            "unsigned_plans_accepted",
            key_id=verifier.key_id,
            hint="require_signed_plans is false: unsigned plans are applied (key roll-out)",
        )
    else:
        log.info("plans_verified", key_id=verifier.key_id)


def hold_agent_lock(settings: AgentSettings) -> AgentLock | None:
    """``agent.lock`` next to the NCCL files, held while the agent runs: ``linkguard exec``
    (:mod:`linkguard.jobenv`) takes files nobody holds it for as a stale plan. A lock that
    cannot be taken is logged; the agent runs on."""
    directory = settings.rail_map_path.parent
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


async def read_layout(settings: AgentSettings, inventory: HostInventory) -> HostInventory:
    """Add the host layout (PCIe switch per HCA and GPU) to the inventory before it is
    announced: read once, off the event loop, from ``nccl_topo_file`` or the PCI sysfs
    tree (not with the simulated driver). Never fatal: without it the inventory has no
    switch ids (the service then ranks alternates by NUMA node), said once in the log.
    Returns ``inventory`` with the layout (or as it was)."""
    s = settings
    sysfs = pci_root(s.sysfs_root) if s.driver != "simulated" else None
    why: str | None
    try:
        layout = await asyncio.to_thread(
            read_host_layout, nccl_topo_file=s.nccl_topo_file, sysfs=sysfs
        )
    except Exception as exc:  # LayoutError, or anything unforeseen: never fatal
        layout, why = None, f"{type(exc).__name__}: {exc}"
    else:
        inventory, why = with_layout(inventory, layout)
    if why is not None:
        # a configured file that fails: warning; a host without a PCI tree: info;
        # the simulated driver (no layout source at all): debug
        level = (
            log.warning
            if s.nccl_topo_file is not None
            else (log.info if sysfs is not None else log.debug)
        )
        level("host_layout_unavailable", host=s.host, reason=why[:500])
        return inventory
    log.info(
        "host_layout",
        host=s.host,
        source=layout.source,
        gpu_pcie_switch=inventory.gpu_pcie_switch,
        hca_pcie_switch={h.key: h.pcie_switch for h in inventory.hcas},
        problems=len(layout.problems),
    )
    return inventory


def make_inventory(
    settings: AgentSettings, discovered: Sequence[DiscoveredPort] | None
) -> HostInventory:
    """The host inventory from the configured ports and the ones found in sysfs
    (``discovered``; None: :func:`discover` them); what does not match is logged."""
    found = discover(settings) if discovered is None else discovered
    for problem in lag_problems(found):
        log.warning(
            "rdma_lag_misconfigured",
            host=settings.host,
            problem=problem,
            hint="the netdev is a bond member but its RDMA device is not the bond's "
            "(mlx5_bond_N): check the bond mode (802.3ad or active-backup) and that both "
            "members are ports of one NIC; until then this device is no rail",
        )
    inventory = build_inventory(
        settings.host,
        configured=settings.ports,
        discovered=found,
        endpoints=settings.endpoints,
        default_link_layer=(
            LinkLayer.ETHERNET if settings.driver == "netlink" else LinkLayer.INFINIBAND
        ),
    )
    warn_ignored(settings, found, inventory)
    return inventory


def make_applier(
    settings: AgentSettings,
    table: RouteTableLike,
    netdevs: Collection[str],
    verifier: Verifier | None,
) -> Applier:
    """The applier of plans into ``table`` (``netdevs``: this host's rail netdevs)."""
    s = settings
    return Applier(
        host=s.host,
        table=table,
        netdevs=netdevs,
        prefixes=s.endpoint_prefixes,
        rail_map_path=s.rail_map_path,
        state_dir=s.state_dir,
        verifier=verifier,
        require_signed=s.require_signed_plans,
        route_source=s.routes.source == "endpoint",
        rto_min_ms=s.routes.rto_min_ms,
        neighbour_flush=s.routes.neighbour_flush,
    )


def make_verifier(settings: AgentSettings) -> Verifier | None:
    """The service's public key (``service_public_key``; None: plans are applied unverified).
    Raises KeyFileError (a ConfigError) for a key file that cannot be read."""
    key = settings.service_public_key
    return Verifier.from_file(key) if key is not None else None


def make_core(
    settings: AgentSettings, netdevs: Collection[str], verifier: Verifier | None, term_path: str
) -> AgentCore:
    """The agent's decisions (fast path, plan acceptance, peer routes, leader term): deletions
    only signed when plans are verified and ``require_signed_plans``."""
    return AgentCore(
        host=settings.host,
        netdevs=netdevs,
        prefixes=settings.endpoint_prefixes,
        signed_deletions_only=verifier is not None and settings.require_signed_plans,
        term_path=term_path,
        journal_resend_s=(settings.journal_resend_after_s, settings.journal_resend_max_s),
    )


def make_inbox(settings: AgentSettings, core: AgentCore, verifier: Verifier | None) -> Inbox:
    """The bus messages' checks (size ``bus.max_message_bytes``, signature, model)."""
    return Inbox(
        core,
        verifier=verifier,
        require_signed=settings.require_signed_plans,
        max_bytes=settings.bus.max_message_bytes,
    )


def make_prober(settings: AgentSettings) -> ProbeRunner | None:
    """Per-rail probes toward the service's targets (``probes.enabled``; None: off)."""
    if not settings.probes.enabled:
        return None
    from linkguard.agent.prober import ProbeRunner  # scapy (~25 MiB) is imported only then

    return ProbeRunner(settings.host, netns=settings.netns)


def make_rails_socket(
    settings: AgentSettings, *, current: Callable[[], dict[str, Any]]
) -> RailMapServer | None:
    """The rails socket for local subscribers (``rails_socket.path``; None: off)."""
    if settings.rails_socket.path is None:
        return None
    return RailMapServer(
        settings.rails_socket.path,
        current=current,
        group=settings.rails_socket.group,
        queue=settings.rails_socket.queue,
    )


def subscriptions(settings: AgentSettings) -> list[str | tuple[str, int]]:
    """The agent's topics: its plan and status, every peer's routes, its probe targets, its
    events' confirmations and the service's status."""
    host = settings.host
    return [
        topics.plan(host),
        topics.status(host),
        # QoS 0: each is retained and replaces the last, so a delivery lost with a
        # connection comes back as the retained copy on the resubscribe; saves every
        # host a PUBACK per peer change (256 per host link event at 256 hosts)
        (topics.all_peer_routes(), 0),
        *([topics.probe_targets(host)] if settings.probes.enabled else []),
        # the event journal: what the service recorded, and when it restarted
        topics.events_confirmed(host),
        topics.service_status(),
    ]
