"""Collect this host's :class:`~linkguard.models.discovery.HostDiscovery` (for ``linkguard
fabric discover``): the RDMA ports in sysfs with their GUIDs, the netdevs from rtnetlink (and
the bonds sysfs shows), lldpd's neighbours, and the agent's inventory.

Consumes: :class:`~linkguard.config.AgentSettings` (``sysfs_root``, ``netns``, ``driver``,
``discovery``) and the agent's inventory. Produces: a HostDiscovery; the agent publishes it
retained on ``hosts/<host>/discovery`` at connect and when it changes, ``linkguard fabric
facts`` prints it. Never raises: what cannot be read is a line in ``problems``.
"""

from __future__ import annotations

import asyncio
import shutil

import structlog

from linkguard.config import AgentSettings
from linkguard.drivers.hostfacts import NET_ROOT, read_host_facts, read_netlink_netdevs
from linkguard.drivers.lldp import LldpError, read_lldp_file, run_lldpctl
from linkguard.models import HostInventory
from linkguard.models.discovery import HostDiscovery, LldpNeighbour, NetdevFacts

__all__ = ["collect_discovery"]

log = structlog.get_logger(__name__)


def _merge(netlink: list[NetdevFacts], sysfs: list[NetdevFacts]) -> list[NetdevFacts]:
    """rtnetlink's interfaces, with a bond's members and master from sysfs where rtnetlink
    gave none (they agree on a real kernel; sysfs alone on a copied tree)."""
    by_name = {n.name: n for n in sysfs}
    out = []
    for n in netlink:
        s = by_name.get(n.name)
        if s is not None and not n.bond_members and not n.bond_master:
            n = n.model_copy(
                update={
                    "bond_members": s.bond_members,
                    "bond_master": s.bond_master,
                    "kind": "bond" if s.kind == "bond" else n.kind,
                }
            )
        out.append(n)
    return out


async def _lldp(settings: AgentSettings, problems: list[str]) -> list[LldpNeighbour]:
    d = settings.discovery
    if d.lldp == "off":
        return []
    try:
        if d.lldp_file is not None:
            return await asyncio.to_thread(read_lldp_file, d.lldp_file)
        if d.lldp == "auto" and shutil.which(d.lldp_command[0]) is None:
            return []
        return await asyncio.to_thread(run_lldpctl, tuple(d.lldp_command))
    except LldpError as exc:
        if d.lldp == "on" or d.lldp_file is not None or "connect" not in str(exc):
            problems.append(f"lldp: {exc}"[:400])
        return []


async def collect_discovery(
    settings: AgentSettings, inventory: HostInventory | None, *, wall: float
) -> HostDiscovery:
    """This host's discovery document at wall-clock time ``wall`` (s). Blocking reads run in
    a thread. With the simulated driver: the inventory alone (no sysfs, no netlink: the
    simulated hosts share this machine's interfaces)."""
    problems: list[str] = []
    if settings.driver == "simulated":
        return HostDiscovery(host=settings.host, inventory=inventory, collected_at=wall)
    ports = []
    sysfs_netdevs: list[NetdevFacts] = []
    if settings.driver == "sysfs":
        facts = await asyncio.to_thread(read_host_facts, settings.sysfs_root, NET_ROOT)
        ports = facts.ports
        problems += facts.problems
        if not ports:
            problems.append(
                f"{settings.sysfs_root}: no RDMA device (RDMA stack not loaded, or another "
                "sysfs_root)"
            )
        if settings.netns is None:  # /sys/class/net is this namespace's
            sysfs_netdevs = facts.netdevs
    try:
        netdevs = _merge(await read_netlink_netdevs(settings.netns), sysfs_netdevs)
    except OSError as exc:
        problems.append(f"rtnetlink: {exc}"[:400])
        netdevs = sysfs_netdevs
    lldp = await _lldp(settings, problems)
    return HostDiscovery(
        host=settings.host,
        inventory=inventory,
        ports=ports[:256],
        netdevs=netdevs[:1024],
        lldp=lldp[:1024],
        problems=problems[:64],
        collected_at=wall,
    )
