"""What a host reports about itself for fabric discovery (``linkguard fabric discover``):
every RDMA port it has (compute or not), its network interfaces (bonds, IPoIB, addresses),
its LLDP neighbours and the agent's own view of its rails (its :class:`HostInventory`).

Published retained by the agent on ``linkguard/v1/hosts/<host>/discovery`` once it has built
its inventory (:func:`linkguard.topics.discovery`); ``linkguard fabric facts`` prints the same
document for a host without the bus. Sources: sysfs ``/sys/class/infiniband`` (node_guid, the
port GUID as the low 64 bits of ``gids/0``, Documentation/ABI/stable/sysfs-class-infiniband),
``/sys/class/net`` (``type`` 32 = ARPHRD_INFINIBAND, ``bonding/slaves``, ``master``,
``carrier``; Documentation/ABI/testing/sysfs-class-net), rtnetlink for IPv4 addresses and the
default route, and lldpd's ``lldpctl -f json``.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field

from linkguard.models.base import (
    HCAName,
    HostInventory,
    HostName,
    LinkLayer,
    NetdevName,
    PortNum,
    PortStateName,
    _Model,
)

__all__ = ["Guid", "HostDiscovery", "LldpNeighbour", "NetdevFacts", "RdmaPortFacts"]

#: A node or port GUID: 16 lowercase hex digits (ibnetdiscover's ``S-``/``H-`` names and the
#: sysfs ``node_guid`` ``0c42:a103:00b5:1234`` without colons).
Guid = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]

_Text = Annotated[str, Field(max_length=256)]


class RdmaPortFacts(_Model):
    """One port of one RDMA device as sysfs shows it (every device, not only the rails)."""

    hca: HCAName
    port: PortNum = 1
    link_layer: LinkLayer | None = None
    node_guid: Guid | None = None
    port_guid: Guid | None = Field(
        None, description="InfiniBand: the low 64 bits of GID 0 (the port GUID); None on RoCE"
    )
    netdev: NetdevName | None = Field(
        None, description="the netdev of this port (IPoIB ibN, RoCE ensN / bondN)"
    )
    pci_address: str | None = Field(None, max_length=32)
    numa_node: int | None = Field(None, ge=-1, le=1023)
    state: PortStateName | None = None
    rate_gbps: float | None = Field(None, ge=0, le=100_000)

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


class NetdevFacts(_Model):
    """One network interface of the host (``/sys/class/net/<name>`` and rtnetlink)."""

    name: NetdevName
    kind: Literal["ether", "ipoib", "bond", "other"] = "other"
    ipv4: list[ipaddress.IPv4Interface] = Field(default_factory=list, max_length=64)
    bond_master: NetdevName | None = Field(None, description="the bond this one is enslaved to")
    bond_members: list[NetdevName] = Field(default_factory=list, max_length=64)
    carrier: bool | None = None
    default_route: bool = Field(False, description="the host's IPv4 default route leaves here")


class LldpNeighbour(_Model):
    """One LLDP neighbour seen on a local interface (lldpd ``lldpctl -f json``)."""

    netdev: NetdevName = Field(description="the local interface it was seen on")
    system: _Text | None = Field(None, description="the neighbour's system name (chassis)")
    chassis_id: _Text | None = None
    port: _Text | None = Field(
        None, description="the neighbour's port: its id when an ifname/local, else its descr"
    )
    port_descr: _Text | None = None
    capabilities: list[Annotated[str, Field(max_length=32)]] = Field(
        default_factory=list,
        max_length=16,
        description="the neighbour's enabled LLDP capabilities (Bridge, Router, Station...)",
    )

    @property
    def switching(self) -> bool:
        """The neighbour says it bridges or routes (a switch, not a host)."""
        return bool({"Bridge", "Router"} & set(self.capabilities))


class HostDiscovery(_Model):
    """Everything one host knows about its own fabric attachment.

    ``inventory``: the agent's inventory (its rails in PCI or configured order, netdevs,
    layout, GPU endpoints), None when it could not build one. ``ports``: every RDMA port found.
    ``problems``: what the host could not read (one line each, source named)."""

    host: HostName
    inventory: HostInventory | None = None
    ports: list[RdmaPortFacts] = Field(default_factory=list, max_length=256)
    netdevs: list[NetdevFacts] = Field(default_factory=list, max_length=1024)
    lldp: list[LldpNeighbour] = Field(default_factory=list, max_length=1024)
    problems: list[Annotated[str, Field(max_length=400)]] = Field(
        default_factory=list, max_length=64
    )
    collected_at: float = Field(0.0, ge=0, description="wall-clock seconds since the Unix epoch")

    def same_as(self, other: HostDiscovery | None) -> bool:
        """Equal but for ``collected_at``, the ports' ``state`` and the carriers (what changes
        without the host's attachment changing)."""
        if other is None:
            return False

        def core(d: HostDiscovery) -> dict:
            data = d.model_dump(exclude={"collected_at"})
            for p in data["ports"]:
                p.pop("state", None)
            for n in data["netdevs"]:
                n.pop("carrier", None)
            return data

        return core(self) == core(other)

    def netdev(self, name: str | None) -> NetdevFacts | None:
        """The interface named ``name``, or None."""
        return next((n for n in self.netdevs if n.name == name), None) if name else None
