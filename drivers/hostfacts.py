"""What this host has, for fabric discovery: every RDMA port with its GUIDs, every network
interface (bonds and their members, IPoIB, carriers), the IPv4 addresses and the default
route's interface, and the LLDP neighbours lldpd saw.

Consumes: sysfs ``/sys/class/infiniband`` (``node_guid``; ``ports/<n>/gids/0``, whose low 64
bits are the port GUID on InfiniBand; ``state``; ``rate``: Documentation/ABI/stable/
sysfs-class-infiniband), ``/sys/class/net/<dev>`` (``type``: 1 ARPHRD_ETHER, 32
ARPHRD_INFINIBAND, include/uapi/linux/if_arp.h; ``bonding/slaves``; ``master``; ``carrier``:
Documentation/ABI/testing/sysfs-class-net), rtnetlink (addresses, the main table's default
route) and ``lldpctl -f json`` (:mod:`linkguard.drivers.lldp`). Produces: the parts of a
:class:`~linkguard.models.discovery.HostDiscovery`. Never raises for a bad file: what cannot
be read is a line in ``problems`` naming the file.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from linkguard.drivers.netlink import open_iproute
from linkguard.drivers.rtnl import NetlinkError
from linkguard.drivers.sysfs_attrs import (
    Reader,
    _listdir,
    _optional,
    parse_rate,
    parse_state,
    read_sysfs,
)
from linkguard.drivers.sysfs_discover import DEFAULT_ROOT, discover_hcas
from linkguard.models import LinkLayer
from linkguard.models.discovery import NetdevFacts, RdmaPortFacts

__all__ = ["NET_ROOT", "HostFacts", "guid_from_text", "read_host_facts", "read_netlink_netdevs"]

#: The network interface class directory.
NET_ROOT = Path("/sys/class/net")

_HEX = re.compile(r"^[0-9a-f]{16}$")
_NETDEV = re.compile(r"^[A-Za-z0-9_.\-@:]{1,15}$")
#: ``/sys/class/net/<dev>/type`` values (include/uapi/linux/if_arp.h)
_ARPHRD_ETHER, _ARPHRD_INFINIBAND = 1, 32


def guid_from_text(text: str | None) -> str | None:
    """16 lowercase hex digits from a sysfs GUID (``0c42:a103:00b5:1234``) or a GID
    (``fe80:0000:0000:0000:0c42:a103:00b5:1235``: its low 64 bits, the port GUID on
    InfiniBand, IBA 4.1.1); None for anything else or an all-zero GUID."""
    if not text:
        return None
    groups = text.strip().lower().split(":")
    if len(groups) == 8:  # a GID: the interface id is the low 64 bits
        groups = groups[4:]
    digits = "".join(g.rjust(4, "0") for g in groups) if len(groups) == 4 else ""
    if not _HEX.match(digits) or digits == "0" * 16:
        return None
    return digits


@dataclass
class HostFacts:
    """What :func:`read_host_facts` found: ``ports`` (every RDMA port), ``netdevs`` (every
    interface of the net class directory, addresses and default route not yet filled in) and
    ``problems`` (one line per unreadable file)."""

    ports: list[RdmaPortFacts] = field(default_factory=list)
    netdevs: list[NetdevFacts] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_host_facts(
    ib_root: Path = DEFAULT_ROOT, net_root: Path = NET_ROOT, *, reader: Reader = read_sysfs
) -> HostFacts:
    """Every RDMA port under ``ib_root`` and every interface under ``net_root``. Blocking file
    I/O (run it off the event loop). Never raises: unreadable or malformed attributes are left
    None and named in ``problems``."""
    out = HostFacts()
    root = str(ib_root)
    for d in discover_hcas(ib_root, reader=reader):
        errors = list(d.errors)
        node_guid = guid_from_text(_optional(reader, root, f"{d.hca}/node_guid", errors))
        for p in d.ports:
            layer = d.link_layers.get(p)
            port_guid = None
            if layer == LinkLayer.INFINIBAND:
                port_guid = guid_from_text(_optional(reader, root, f"{d.hca}/ports/{p}/gids/0", []))
            state_text = _optional(reader, root, f"{d.hca}/ports/{p}/state", errors)
            state, bad = parse_state(state_text) if state_text else (None, None)
            if bad:
                errors.append(f"{d.hca}/ports/{p}/state: {bad}")
            rate_text = _optional(reader, root, f"{d.hca}/ports/{p}/rate", errors)
            rate, bad = parse_rate(rate_text) if rate_text else (None, None)
            if bad:
                errors.append(f"{d.hca}/ports/{p}/rate: {bad}")
            if layer == LinkLayer.INFINIBAND and node_guid is None and port_guid is None:
                errors.append(
                    f"{d.hca}/ports/{p}: no node_guid or gids/0 GUID: it cannot be matched to "
                    "an ibnetdiscover dump by GUID"
                )
            out.ports.append(
                RdmaPortFacts(
                    hca=d.hca,
                    port=p,
                    link_layer=layer,
                    node_guid=node_guid,
                    port_guid=port_guid,
                    netdev=d.netdevs.get(p),
                    pci_address=d.pci_address,
                    numa_node=d.numa_node,
                    state=state,
                    rate_gbps=rate,
                )
            )
        out.problems += [f"{ib_root}/{e}" for e in errors]
    out.netdevs = _netdevs(net_root, reader, out.problems)
    return out


def _netdevs(net_root: Path, reader: Reader, problems: list[str]) -> list[NetdevFacts]:
    root = str(net_root)
    errors: list[str] = []
    names = [n for n in _listdir(root, "", errors) if _NETDEV.match(n) and n != "lo"]
    bonds = {n for n in names if os.path.isdir(f"{root}/{n}/bonding")}
    out = []
    for name in names:
        kind_text = _optional(reader, root, f"{name}/type", errors)
        kind: Literal["ether", "ipoib", "bond", "other"] = (
            "bond"
            if name in bonds
            else "ipoib"
            if kind_text == str(_ARPHRD_INFINIBAND)
            else "ether"
            if kind_text == str(_ARPHRD_ETHER)
            else "other"
        )
        members: list[str] = []
        if name in bonds:
            text = _optional(reader, root, f"{name}/bonding/slaves", errors) or ""
            members = [m for m in text.split() if _NETDEV.match(m)]
        master = None
        link = f"{root}/{name}/master"
        if os.path.islink(link):
            target = os.path.basename(os.readlink(link))
            master = target if target in bonds else None
        carrier_text = _optional(reader, root, f"{name}/carrier", [])  # EINVAL when down
        out.append(
            NetdevFacts(
                name=name,
                kind=kind,
                bond_master=master,
                bond_members=members,
                carrier=None if carrier_text not in ("0", "1") else carrier_text == "1",
            )
        )
    problems += [f"{net_root}/{e}" for e in errors]
    return out


Addresses = dict[str, list[ipaddress.IPv4Interface]]


async def read_netlink_netdevs(netns: str | None = None) -> list[NetdevFacts]:
    """Every interface but ``lo`` of ``netns`` (None: this namespace) from rtnetlink: kind
    (``ifi_type`` 32 ARPHRD_INFINIBAND: ipoib; ``IFLA_LINKINFO`` kind ``bond``: bond), the bond
    it is enslaved to (``IFLA_MASTER``, when that is a bond) and a bond's members, carrier
    (``IFLA_CARRIER``), IPv4 addresses and whether the main table's default route leaves by
    it. Raises OSError (:class:`~linkguard.drivers.netlink.NetnsNotFoundError`, or a netlink
    error) when the namespace or the kernel cannot be asked."""
    ipr = open_iproute(netns)
    try:
        links = [m async for m in await ipr.link("dump")]
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in links}
        addrs: Addresses = {}
        async for a in await ipr.addr("dump", family=2):
            name, addr = names.get(a["index"]), a.get_attr("IFA_ADDRESS")
            if name is not None and addr is not None:
                addrs.setdefault(name, []).append(
                    ipaddress.IPv4Interface(f"{addr}/{a['prefixlen']}")
                )
        default: set[str] = set()
        with contextlib.suppress(NetlinkError):
            async for r in await ipr.route("dump", family=2, table=254):
                oif = r.get_attr("RTA_OIF")
                if r["dst_len"] == 0 and oif in names:
                    default.add(names[oif])
    finally:
        ipr.close()
    kinds: dict[str, Literal["ether", "ipoib", "bond", "other"]] = {}
    masters: dict[str, str] = {}
    for m in links:
        name = names[m["index"]]
        info = m.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        kinds[name] = (
            "bond"
            if kind == "bond"
            else "ipoib"
            if m["ifi_type"] == _ARPHRD_INFINIBAND or kind == "ipoib"
            else "ether"
            if m["ifi_type"] == _ARPHRD_ETHER
            else "other"
        )
        master = names.get(m.get_attr("IFLA_MASTER"))
        if master is not None:
            masters[name] = master
    out = []
    for m in links:
        name = names[m["index"]]
        if name == "lo" or not name or not _NETDEV.match(name):
            continue
        master = masters.get(name)
        carrier = m.get_attr("IFLA_CARRIER")
        members = sorted(n for n, b in masters.items() if b == name)
        out.append(
            NetdevFacts(
                name=name,
                kind=kinds[name],
                ipv4=addrs.get(name, [])[:64],
                bond_master=master if master and kinds.get(master) == "bond" else None,
                bond_members=members if kinds[name] == "bond" else [],
                carrier=None if carrier is None else bool(carrier),
                default_route=name in default,
            )
        )
    return out
