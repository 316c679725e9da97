"""The switch side of fabric discovery: switches, the cables from host ports to switch ports,
and the cables between switches, from an ibnetdiscover dump (InfiniBand) or LLDP neighbour
tables (RoCE).

Consumes: an :class:`~linkguard.topology.ibnetdiscover.IBTopology` (with an optional GUID ->
host map), or LLDP neighbours (:class:`~linkguard.models.discovery.LldpNeighbour`) reported by
hosts and by switches. Produces: a :class:`SwitchGraph`, which
:func:`linkguard.topology.discover.discover_fabric` joins with the hosts' own reports.
Pure: no I/O.

A host-side cable end is known by whatever the source gives: the port GUID and the CA's node
GUID (ibnetdiscover), the host and device named by the CA's NodeDescription (rdma-ndd's default
``"<host> <device>"``) or a GUID map, or the host and interface that saw the switch (LLDP).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from linkguard.models.discovery import LldpNeighbour
from linkguard.topology.ibnetdiscover import IBTopology
from linkguard.topology.ibnetdiscover import _host_from_description as host_from_description
from linkguard.topology.ibnetdiscover import _safe_name as safe_name
from linkguard.topology.ibnetdiscover import _unique as unique_name

__all__ = [
    "HostCable",
    "SwitchGraph",
    "SwitchInfo",
    "SwitchLink",
    "from_ibnetdiscover",
    "from_lldp",
]

_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class SwitchInfo:
    """One switch: its name in the fabric, node GUID and description where known."""

    name: str
    guid: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class HostCable:
    """A cable from a host port to ``switch`` port ``switch_port`` (None: not numbered).

    Host-side identity, any of: ``port_guid``; ``node_guid`` + ``ca_port``; ``host`` +
    ``hca`` (+ ``ca_port``); ``host`` + ``netdev`` (LLDP). ``source`` says where it was read
    (``X5.topofile line 306``, ``lldp gpu000 ens1np0``)."""

    switch: str
    switch_port: int | None
    source: str
    port_guid: str | None = None
    node_guid: str | None = None
    ca_port: int | None = None
    host: str | None = None
    hca: str | None = None
    netdev: str | None = None
    rate_gbps: float | None = None
    width: str | None = None
    speed: str | None = None


@dataclass(frozen=True)
class SwitchLink:
    """A cable between two switch ports."""

    a: str
    a_port: int | None
    b: str
    b_port: int | None
    rate_gbps: float | None = None
    width: str | None = None
    speed: str | None = None


@dataclass
class SwitchGraph:
    """Switches by name, host cables and switch-to-switch cables, with what was inferred
    (``notes``) and what looked wrong (``warnings``)."""

    source: str
    switches: dict[str, SwitchInfo] = field(default_factory=dict)
    cables: list[HostCable] = field(default_factory=list)
    links: list[SwitchLink] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def from_ibnetdiscover(topo: IBTopology, guid_map: Mapping[str, str] | None = None) -> SwitchGraph:
    """The switch graph of an ibnetdiscover dump (or ibsim net file): switches and routers
    named as :func:`~linkguard.topology.ibnetdiscover.import_ibnetdiscover` names them, each
    CA port's cable with its port GUID, node GUID, and the host (``guid_map`` by node GUID,
    else the NodeDescription's first word, else a node name that is not ``H-<guid>``: ibsim's
    ``"Hca1"``) and device the description names."""
    g = SwitchGraph(source=topo.source, notes=list(topo.notes), warnings=list(topo.warnings))
    taken: set[str] = set()
    names: dict[int, str] = {}
    for n in topo.nodes:
        if n.kind == "ca":
            continue
        names[n.index] = unique_name(safe_name(n.name, f"switch{n.index}"), taken)
        g.switches[names[n.index]] = SwitchInfo(
            names[n.index], n.guid, n.description[:256] if n.description else None
        )
    ca_ca = 0
    for link in topo.links:
        a_sw, b_sw = link.a in names, link.b in names
        if a_sw and b_sw:
            if link.a != link.b:
                g.links.append(
                    SwitchLink(
                        names[link.a],
                        link.a_port,
                        names[link.b],
                        link.b_port,
                        link.rate_gbps,
                        link.width,
                        link.speed,
                    )
                )
            continue
        if not a_sw and not b_sw:
            ca_ca += 1
            continue
        ca, cp, sw, sp = (
            (link.b, link.b_port, link.a, link.a_port)
            if a_sw
            else (link.a, link.a_port, link.b, link.b_port)
        )
        node = topo.nodes[ca]
        host, dev = host_from_description(node.description)
        if guid_map and node.guid is not None and node.guid in guid_map:
            host = guid_map[node.guid]
        elif host is None and not (node.name.startswith("H-") and node.guid):
            host = node.name  # ibsim's "Hca1": the node's own name
        g.cables.append(
            HostCable(
                switch=names[sw],
                switch_port=sp,
                source=f"{topo.source} line {link.line}",
                port_guid=topo.port_guids.get((ca, cp)),
                node_guid=node.guid,
                ca_port=cp,
                host=host,
                hca=dev,
                rate_gbps=link.rate_gbps,
                width=link.width,
                speed=link.speed,
            )
        )
    if ca_ca:
        g.warnings.append(f"{ca_ca} CA-to-CA cables left out (no switch between them)")
    return g


def _port_number(name: str | None) -> int | None:
    """``swp12`` -> 12, ``Ethernet8`` -> 8; None without a trailing number in 1..255."""
    m = _TRAILING_NUMBER.search(name or "")
    return int(m[1]) if m and 1 <= int(m[1]) <= 255 else None


def from_lldp(
    hosts: Mapping[str, Sequence[LldpNeighbour]],
    switches: Mapping[str, Sequence[LldpNeighbour]] = {},
    *,
    source: str = "lldp",
) -> SwitchGraph:
    """The switch graph from LLDP: ``hosts`` maps a host to the neighbours its lldpd saw (each
    neighbour of a host is a switch port its interface is cabled to), ``switches`` maps a
    switch to the neighbours its own lldpd saw (a neighbour that is a reporting host confirms a
    host cable; a switch named by a host's table or given here, or a neighbour that says it
    bridges or routes, is a switch-to-switch cable, listed once; any other is a host that
    reported nothing, left out with a note).

    A switch is named by its LLDP system name, else its chassis id (``:`` -> ``-``); the port
    number is the trailing number of the port's name (``swp12`` -> 12), else unknown."""
    g = SwitchGraph(source=source)

    def switch(n: LldpNeighbour) -> str | None:
        raw = n.system or (n.chassis_id or "").replace(":", "-")
        if not raw:
            return None
        name = safe_name(raw, raw)
        g.switches.setdefault(name, SwitchInfo(name, description=None))
        return name

    nameless = []
    for host, seen in sorted(hosts.items()):
        for n in seen:
            sw = switch(n)
            if sw is None:
                nameless.append(f"{host} {n.netdev}")
                continue
            g.cables.append(
                HostCable(
                    switch=sw,
                    switch_port=_port_number(n.port),
                    source=f"{source} {host} {n.netdev}",
                    host=host,
                    netdev=n.netdev,
                )
            )
    if nameless:
        g.warnings.append(
            f"{len(nameless)} LLDP neighbours with neither system name nor chassis id left out: "
            + ", ".join(nameless[:5])
        )
    seen_links: set[frozenset[tuple[str, str]]] = set()
    known = set(g.switches) | {safe_name(s, s) for s in switches}
    stations: list[str] = []
    for sw_raw, seen in sorted(switches.items()):
        here = safe_name(sw_raw, sw_raw)
        g.switches.setdefault(here, SwitchInfo(here))
        for n in seen:
            if n.system in hosts:
                continue  # a host's cable: the host's own report places it
            raw = n.system or (n.chassis_id or "").replace(":", "-")
            if not raw or (safe_name(raw, raw) not in known and not n.switching):
                stations.append(f"{here} {n.netdev}: {raw or '?'}")
                continue  # a host without a report (no Bridge/Router capability)
            other = switch(n)
            if other is None or other == here:
                continue
            key = frozenset({(here, n.netdev), (other, n.port or "")})
            if key in seen_links:
                continue
            seen_links.add(key)
            g.links.append(SwitchLink(here, _port_number(n.netdev), other, _port_number(n.port)))
    if stations:
        g.notes.append(
            f"{len(stations)} neighbours in the switch tables are neither reporting hosts nor "
            f"switches (no Bridge/Router capability) and left out: {', '.join(stations[:5])}"
        )
    g.notes.append(
        f"LLDP: {len(g.cables)} host cables from {len(hosts)} hosts, {len(g.links)} "
        f"switch-to-switch cables from {len(switches)} switch tables"
    )
    return g
