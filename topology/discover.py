"""Fabric discovery: a fabric the topology service accepts, built from what the hosts report
about themselves and a switch graph (ibnetdiscover or LLDP), plus a list of what could not be
determined, host and device named.

Consumes: each host's :class:`~linkguard.models.discovery.HostDiscovery` (its RDMA ports with
GUIDs, netdevs, addresses, LLDP neighbours, and the agent's own inventory: rails in PCI order,
GPU layout, endpoints) and a :class:`~linkguard.topology.switchgraph.SwitchGraph`. Produces: a
:class:`Discovery` (a validated, servable :class:`~linkguard.topology.fabric.Fabric` or None,
the ``unknowns``, notes and warnings). Pure: no I/O, no clock.

The rules, in order (each port left out is an :class:`Unknown` saying which rule):

1. **Candidate ports.** Every RDMA port the host reports, except:
   ``lag_member`` (its netdev is enslaved to a bond but the device is not the bond device: a
   LAG misconfiguration, never a rail of its own), ``management`` (its netdev, or the bond it
   is in, carries the host's IPv4 default route), ``not_compute`` (an Ethernet port on a host
   that has InfiniBand ports: a DGX-style in-band / storage NIC such as ``mlx5_bond_0``).
2. **Cabling.** A candidate's cable in the switch graph, matched by port GUID, then node GUID
   and port number, then host and device (the CA's NodeDescription or a GUID map), then host
   and netdev (LLDP; for a bond, its members). None: ``not_in_switch_graph``.
3. **Rails.** A switch a candidate is cabled to is a leaf; its rail is the rail most of its
   ports have in their own host's numbering (the agent's inventory: PCI order or configured;
   else the port's position among the host's candidates in PCI, then device-name order), the
   lowest on a tie. Every port takes its leaf's rail. A leaf whose ports disagree is reported
   (``leaf_numbering``): rail-optimized wiring, hosts numbering their NICs differently. Two
   ports of one host on leaves of one rail is wiring that is not rail-optimized: the port whose
   own number is the rail's stays, the other is left out (``not_rail_optimized``).
4. **Addresses.** A port's next-hop address is the IPv4 address on its netdev (the bond's for
   a bond device), else the one the agent's ``ports:`` config gives it; without one, the
   ``rail_prefix`` plan's (the generator's layout: rail r,
   host h in fabric order -> r-th subnet, (h+1)-th address); without either the port is left
   out (``no_address``). A port without a netdev is left out (``no_netdev``): a plan's routes
   leave by it. ``rail_subnets`` are the hosts' own networks when every address of a rail is
   in one, else the plan's.
5. **Endpoints.** The agent's configured GPU endpoints; without them the ``endpoint_prefix``
   plan's (the generator's rail-major layout) for the GPUs the host's layout shows, else one
   per rail; without either the host is left out (``no_endpoints``).
6. **Switches.** Leaves are grouped into SUs by the hosts they share; a switch with no host
   cable is a spine; switch-to-switch cables keep their kinds (leaf-spine, leaf-leaf,
   spine-spine).
"""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from linkguard.models import HCAInfo, HostInventory, LinkLayer
from linkguard.models.discovery import HostDiscovery, RdmaPortFacts
from linkguard.topology.discoverswitches import Placed, fabric_switches, natural, pci_order
from linkguard.topology.fabric import Fabric, Link, Switch, serving_problems
from linkguard.topology.generator import _endpoint_subnet_size, _rail_subnet_size, rail_subnets
from linkguard.topology.switchgraph import HostCable, SwitchGraph

__all__ = ["Discovery", "Unknown", "discover_fabric"]


@dataclass(frozen=True)
class Unknown:
    """What discovery could not determine or left out: ``host``, ``device`` (``mlx5_3/1``, a
    switch name, or None for the host as a whole), ``rule`` (the rule's name, see the module
    docstring) and ``detail`` (a sentence)."""

    host: str | None
    device: str | None
    rule: str
    detail: str

    def line(self) -> str:
        where = " ".join(x for x in (self.host, self.device) if x) or "-"
        return f"{where}: {self.rule}: {self.detail}"


@dataclass
class Discovery:
    """The result: ``fabric`` (None when no host could be placed), ``unknowns``, ``notes``
    (what was inferred), ``warnings`` (what looks wrong in the input) and ``guids`` (fabric
    name -> GUID: ``"<host>:<hca>"`` node, ``"<host>:<hca>/<port>"`` port, switch names)."""

    fabric: Fabric | None
    unknowns: list[Unknown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    guids: dict[str, str] = field(default_factory=dict)


class _Run:
    def __init__(
        self,
        hosts: Sequence[HostDiscovery],
        graph: SwitchGraph,
        rail_prefix: str | None,
        endpoint_prefix: str | None,
        gpus_per_host: int | None,
        name: str,
    ) -> None:
        self.name = name
        self.hosts = sorted(hosts, key=lambda d: natural(d.host))
        self.graph = graph
        self.rail_prefix = rail_prefix
        self.endpoint_prefix = endpoint_prefix
        self.gpus_per_host = gpus_per_host
        self.out = Discovery(fabric=None, notes=list(graph.notes), warnings=list(graph.warnings))

    def unknown(self, host: str | None, device: str | None, rule: str, detail: str) -> None:
        self.out.unknowns.append(Unknown(host, device, rule, detail))

    # 1. candidates --------------------------------------------------------------------
    def candidates(self, d: HostDiscovery) -> list[RdmaPortFacts]:
        ports = list(d.ports)
        if not ports and d.inventory is not None:  # an agent without sysfs facts (simulated)
            ports = [
                RdmaPortFacts(
                    hca=c.hca,
                    port=c.port,
                    link_layer=c.link_layer,
                    netdev=c.netdev,
                    pci_address=c.pci_address,
                    numa_node=c.numa_node,
                )
                for c in d.inventory.hcas
            ]
        has_ib = any(p.link_layer == LinkLayer.INFINIBAND for p in ports)
        pinned = {c.key: c.netdev for c in (d.inventory.hcas if d.inventory else []) if c.netdev}
        out = []
        for p in ports:
            if p.netdev is None and p.key in pinned:  # the agent's ports: config names it
                p = p.model_copy(update={"netdev": pinned[p.key]})
            nd = d.netdev(p.netdev)
            master = d.netdev(nd.bond_master) if nd is not None else None
            if nd is not None and master is not None:
                self.unknown(
                    d.host,
                    p.key,
                    "lag_member",
                    f"its netdev {nd.name} is enslaved to bond {master.name} but {p.hca} is not "
                    "the bond's RDMA device (a LAG misconfiguration: the bond device carries "
                    "RDMA for the bond); not a rail",
                )
                continue
            if nd is not None and nd.default_route:
                self.unknown(
                    d.host,
                    p.key,
                    "management",
                    f"the host's default route leaves by {nd.name}: a management NIC",
                )
                continue
            if has_ib and p.link_layer == LinkLayer.ETHERNET:
                self.unknown(
                    d.host,
                    p.key,
                    "not_compute",
                    "an Ethernet port on a host with InfiniBand ports (in-band / storage NIC)",
                )
                continue
            out.append(p)
        return out

    # 2. cabling -------------------------------------------------------------------------
    def index_cables(self) -> None:
        self.by_port_guid: dict[str, HostCable] = {}
        self.by_node_port: dict[tuple[str, int | None], HostCable] = {}
        self.by_host_hca: dict[tuple[str, str, int | None], HostCable] = {}
        self.by_host_netdev: dict[tuple[str, str], HostCable] = {}
        #: cables that name a host but neither device nor netdev (matched by position)
        self.by_host: dict[str, list[HostCable]] = defaultdict(list)
        for c in self.graph.cables:
            if c.port_guid:
                self.by_port_guid.setdefault(c.port_guid, c)
            if c.node_guid:
                self.by_node_port.setdefault((c.node_guid, c.ca_port), c)
            if c.host and c.hca:
                self.by_host_hca.setdefault((c.host, c.hca, c.ca_port), c)
            if c.host and c.netdev:
                self.by_host_netdev.setdefault((c.host, c.netdev), c)
            if c.host and not c.hca and not c.netdev:
                self.by_host[c.host].append(c)
        self.used: set[int] = set()

    def cable(self, d: HostDiscovery, p: RdmaPortFacts) -> HostCable | None:
        found = (
            (p.port_guid and self.by_port_guid.get(p.port_guid))
            or (p.node_guid and self.by_node_port.get((p.node_guid, p.port)))
            or self.by_host_hca.get((d.host, p.hca, p.port))
            or self.by_host_hca.get((d.host, p.hca, None))
            or (p.netdev and self.by_host_netdev.get((d.host, p.netdev)))
        )
        nd = d.netdev(p.netdev)
        if not found and nd is not None:
            for member in nd.bond_members:  # LLDP runs on a bond's members
                found = self.by_host_netdev.get((d.host, member))
                if found:
                    break
        if not found or id(found) in self.used:
            return None
        self.used.add(id(found))
        return found

    def by_position(self, d: HostDiscovery, ports: list[RdmaPortFacts]) -> dict[str, HostCable]:
        """Cables that name ``d``'s host but no device (an ibsim file, a dump whose CAs a GUID
        map names by host only), paired in order with ``ports`` (PCI, then name order) when
        the counts agree; a warning names the host either way."""
        if not ports:
            return {}
        left = [c for c in self.by_host.get(d.host, []) if id(c) not in self.used]
        if not left:
            return {}
        if len(left) != len(ports):
            self.out.warnings.append(
                f"host {d.host}: the switch graph names it on {len(left)} cables without "
                f"device names and it has {len(ports)} unplaced ports: not matched"
            )
            return {}
        self.out.warnings.append(
            f"host {d.host}: {len(ports)} ports matched to the switch graph by position (the "
            "graph names the host but not its devices: check the rails)"
        )
        order = {s: i for i, s in enumerate(self.graph.switches)}
        left.sort(key=lambda c: (order.get(c.switch, 0), c.node_guid or "", c.ca_port or 0))
        for c in left:
            self.used.add(id(c))
        return {p.key: c for p, c in zip(sorted(ports, key=pci_order), left, strict=True)}

    def place(self) -> list[Placed]:
        self.index_cables()
        placed: list[Placed] = []
        for d in self.hosts:
            own = {c.key: c.rail for c in d.inventory.hcas} if d.inventory else {}
            cands = self.candidates(d)
            order = {p.key: i for i, p in enumerate(sorted(cands, key=pci_order))}
            found = {p.key: self.cable(d, p) for p in cands}
            found.update(self.by_position(d, [p for p in cands if found[p.key] is None]))
            for p in cands:
                cable = found[p.key]
                if cable is None:
                    self.unknown(
                        d.host,
                        p.key,
                        "not_in_switch_graph",
                        f"no cable found in {self.graph.source} (port GUID "
                        f"{p.port_guid or 'unknown'}, node GUID {p.node_guid or 'unknown'}, "
                        f"netdev {p.netdev or 'none'}): not cabled, "
                        + (
                            "or its lldpd saw no neighbour on that netdev"
                            if self.graph.source.startswith("lldp")
                            else "or the dump is of another fabric"
                        ),
                    )
                    continue
                placed.append(Placed(d.host, p, cable, own.get(p.key, order[p.key])))
        unused = [c for c in self.graph.cables if id(c) not in self.used]
        if unused:
            shown = ", ".join(f"{c.host or c.node_guid or '?'} -> {c.switch}" for c in unused[:5])
            self.out.notes.append(
                f"{len(unused)} host cables in {self.graph.source} match no reporting host "
                f"(hosts without an agent, or ports left out above): {shown}"
            )
        return placed

    # 3. rails ---------------------------------------------------------------------------
    def rails(self, placed: list[Placed]) -> list[Placed]:
        votes: dict[str, Counter[int]] = defaultdict(Counter)
        for pl in placed:
            votes[pl.cable.switch][pl.own_rail] += 1
        self.leaf_rail = {sw: min(c, key=lambda r: (-c[r], r)) for sw, c in votes.items()}
        for sw, c in sorted(votes.items()):
            if len(c) > 1:
                counts = ", ".join(f"{n} as their rail {r}" for r, n in sorted(c.items()))
                self.unknown(
                    None,
                    sw,
                    "leaf_numbering",
                    f"its ports are numbered differently by their hosts ({counts}); the leaf "
                    f"is rail {self.leaf_rail[sw]} and each port takes it (agents whose own "
                    "numbering differs show an inventory mismatch until their ports: config "
                    "pins the rail)",
                )
        kept: list[Placed] = []
        by_host: dict[str, list[Placed]] = defaultdict(list)
        for pl in placed:
            pl.rail = self.leaf_rail[pl.cable.switch]
            by_host[pl.host].append(pl)
        for host, pls in by_host.items():
            taken: dict[int, Placed] = {}
            for pl in sorted(pls, key=lambda x: (x.own_rail != x.rail, pci_order(x.port))):
                first = taken.setdefault(pl.rail, pl)
                if first is not pl:
                    self.unknown(
                        host,
                        pl.port.key,
                        "not_rail_optimized",
                        f"cabled to {pl.cable.switch}, a leaf of rail {pl.rail}, which "
                        f"{first.port.key} (on {first.cable.switch}) already has on this host",
                    )
                    continue
                kept.append(pl)
        return kept

    # 4. addresses -----------------------------------------------------------------------
    def addresses(self, placed: list[Placed]) -> dict[int, ipaddress.IPv4Network]:
        disc = {d.host: d for d in self.hosts}
        self.address: dict[int, ipaddress.IPv4Interface] = {}
        for pl in placed:
            d = disc[pl.host]
            nd = d.netdev(pl.port.netdev)
            usable = [
                a
                for a in (nd.ipv4 if nd is not None else [])
                if not a.ip.is_link_local and not a.ip.is_loopback
            ]
            mine = next(
                (c for c in (d.inventory.hcas if d.inventory else []) if c.key == pl.port.key),
                None,
            )
            if usable:
                self.address[id(pl)] = usable[0]
            elif mine is not None and mine.address is not None:  # the agent's ports: config
                self.address[id(pl)] = ipaddress.IPv4Interface(mine.address)
        nets: dict[int, set[ipaddress.IPv4Network]] = defaultdict(set)
        for pl in placed:
            if id(pl) in self.address:  # a configured address (/32) says no subnet
                nets[pl.rail].add(self.address[id(pl)].network)
        nets = {r: n for r, n in nets.items() if all(x.prefixlen < 31 for x in n)}
        if not self.rail_prefix:
            return {r: next(iter(n)) for r, n in nets.items() if len(n) == 1}
        return {}

    def plan_addresses(
        self, placed: list[Placed], order: list[str]
    ) -> dict[int, ipaddress.IPv4Network]:
        """Fill missing addresses from the rail plan; returns the plan's subnets ({} without)."""
        if not self.rail_prefix:
            return {}
        prefix = ipaddress.IPv4Network(self.rail_prefix)
        n_rails = max(pl.rail for pl in placed) + 1
        size = _rail_subnet_size(prefix, len(order), n_rails)
        subnets = rail_subnets(prefix, size, n_rails)
        pos = {h: i for i, h in enumerate(order)}
        base = int(prefix.network_address)
        planned = 0
        for pl in placed:
            if id(pl) not in self.address:
                addr = ipaddress.IPv4Address(base + pl.rail * size + pos[pl.host] + 1)
                self.address[id(pl)] = ipaddress.IPv4Interface((addr, subnets[pl.rail].prefixlen))
                planned += 1
        self.out.notes.append(
            f"{planned} rail addresses planned in {prefix} (the generator's layout: rail r, "
            f"host h -> {prefix.network_address} + r*{size} + h + 1); the hosts must carry them"
        )
        return dict(subnets)

    # 5./6. the fabric --------------------------------------------------------------------
    def run(self) -> Discovery:
        placed = self.rails(self.place())
        disc = {d.host: d for d in self.hosts}
        for pl in list(placed):
            if not pl.port.netdev:
                self.unknown(
                    pl.host,
                    pl.port.key,
                    "no_netdev",
                    "no netdev in sysfs or in the agent's ports: config (IPoIB not configured? "
                    "pin it with ports: [{hca, port, netdev}]): a rail's routes leave by it",
                )
                placed.remove(pl)
        host_subnets = self.addresses(placed)
        if not self.rail_prefix:
            for pl in list(placed):
                if id(pl) not in self.address:
                    self.unknown(
                        pl.host,
                        pl.port.key,
                        "no_address",
                        f"no IPv4 address on {pl.port.netdev} (give a rail prefix to plan one)",
                    )
                    placed.remove(pl)
        per_host: dict[str, list[Placed]] = defaultdict(list)
        for pl in placed:
            per_host[pl.host].append(pl)
        order = [d.host for d in self.hosts if per_host.get(d.host)]
        for d in self.hosts:
            if not per_host.get(d.host) and d.host not in {u.host for u in self.out.unknowns}:
                self.unknown(d.host, None, "no_rails", "no RDMA port reported")
        if not placed:
            return self.out
        subnets = self.plan_addresses(placed, order) or host_subnets
        endpoints = self.endpoints(order, per_host, disc)
        hosts = []
        for h in order:
            if h not in endpoints:
                continue
            hosts.append(self.inventory(disc[h], per_host[h], endpoints[h]))
        if not hosts:
            return self.out
        keep = {h.host for h in hosts}
        placed = [pl for pl in placed if pl.host in keep]
        leaves = {pl.cable.switch for pl in placed}
        fabric_links, switches = self.switches(placed, leaves)
        ep_subnets = getattr(self, "endpoint_subnets", {})
        try:
            fabric = Fabric(
                name=self.name,
                hosts=hosts,
                switches=switches,
                links=fabric_links,
                rail_subnets={r: n for r, n in subnets.items() if r in {p.rail for p in placed}},
                endpoint_subnets=ep_subnets,
            )
        except ValidationError as exc:
            for e in exc.errors()[:5]:
                self.unknown(None, None, "invalid", e["msg"].removeprefix("Value error, "))
            return self.out
        for problem in serving_problems(fabric):
            self.unknown(None, None, "not_servable", problem)
        self.out.fabric = fabric
        for pl in placed:
            if pl.port.node_guid:
                self.out.guids[f"{pl.host}:{pl.port.hca}"] = pl.port.node_guid
            if pl.port.port_guid:
                self.out.guids[f"{pl.host}:{pl.port.key}"] = pl.port.port_guid
        for s in switches:
            if s.guid:
                self.out.guids[s.name] = s.guid
        return self.out

    def endpoints(
        self, order: list[str], per_host: dict[str, list[Placed]], disc: dict[str, HostDiscovery]
    ) -> dict[str, list[ipaddress.IPv4Address]]:
        out: dict[str, list[ipaddress.IPv4Address]] = {}
        for h in order:
            inv = disc[h].inventory
            if inv is not None and inv.endpoints:
                out[h] = list(inv.endpoints)
        need = [h for h in order if h not in out]
        if need and not self.endpoint_prefix:
            for h in need:
                self.unknown(
                    h,
                    None,
                    "no_endpoints",
                    "no GPU endpoints (set endpoints: in the agent's config, or give an "
                    "endpoint prefix to plan them)",
                )
            return out
        if not need:
            return out

        def gpus(h: str) -> int:
            inv = disc[h].inventory
            layout = len(inv.gpu_numa or inv.gpu_pcie_switch) if inv else 0
            return self.gpus_per_host or layout or len(per_host[h])

        n_rails = max(pl.rail for pls in per_host.values() for pl in pls) + 1
        per_rail = max(-(-gpus(h) // len(per_host[h])) for h in need)
        prefix = ipaddress.IPv4Network(str(self.endpoint_prefix))
        esize = _endpoint_subnet_size(prefix, len(order), per_rail, n_rails)
        self.endpoint_subnets = rail_subnets(prefix, esize, n_rails)
        base = int(prefix.network_address)
        pos = {h: i for i, h in enumerate(order)}
        for h in need:
            rails = sorted(pl.rail for pl in per_host[h])
            out[h] = [
                ipaddress.IPv4Address(
                    base + rails[g % len(rails)] * esize + pos[h] * per_rail + g // len(rails) + 1
                )
                for g in range(gpus(h))
            ]
        self.out.notes.append(
            f"GPU endpoints of {len(need)} hosts planned in {prefix} (rail-major, the "
            "generator's layout); the hosts must carry them (endpoints: in the agent config)"
        )
        return out

    def inventory(
        self, d: HostDiscovery, pls: list[Placed], endpoints: list[ipaddress.IPv4Address]
    ) -> HostInventory:
        own = {c.key: c for c in d.inventory.hcas} if d.inventory else {}
        hcas = []
        for pl in sorted(pls, key=lambda x: x.rail):
            mine = own.get(pl.port.key)
            hcas.append(
                HCAInfo(
                    hca=pl.port.hca,
                    port=pl.port.port,
                    rail=pl.rail,
                    link_layer=pl.port.link_layer or LinkLayer.INFINIBAND,
                    netdev=pl.port.netdev,
                    pci_address=pl.port.pci_address,
                    numa_node=pl.port.numa_node if pl.port.numa_node != -1 else None,
                    pcie_switch=mine.pcie_switch if mine else None,
                    address=self.address[id(pl)].ip,
                )
            )
        inv = d.inventory
        layout_fits = inv is not None and len(inv.endpoints or endpoints) == len(endpoints)
        return HostInventory(
            host=d.host,
            hcas=hcas,
            endpoints=endpoints,
            gpu_numa=list(inv.gpu_numa) if inv and layout_fits and inv.gpu_numa else [],
            gpu_pcie_switch=(
                list(inv.gpu_pcie_switch) if inv and layout_fits and inv.gpu_pcie_switch else []
            ),
        )

    def switches(self, placed: list[Placed], leaves: set[str]) -> tuple[list[Link], list[Switch]]:
        """Host-leaf links, the switches (leaves by SU, spines) and the switch cables."""
        links, switches, notes = fabric_switches(
            placed, leaves, self.graph, self.leaf_rail, [d.host for d in self.hosts]
        )
        self.out.notes += notes
        return links, switches


def discover_fabric(
    hosts: Sequence[HostDiscovery],
    graph: SwitchGraph,
    *,
    name: str = "discovered",
    rail_prefix: str | None = None,
    endpoint_prefix: str | None = None,
    gpus_per_host: int | None = None,
) -> Discovery:
    """Join the hosts' reports with ``graph`` by the rules of this module's docstring.

    ``rail_prefix`` / ``endpoint_prefix``: IPv4 networks to plan the addresses and endpoints
    the hosts do not report (None: such ports / hosts are left out and listed).
    ``gpus_per_host``: GPUs per host for planned endpoints (default: the host's GPU layout,
    else one per rail). Raises ValueError for a prefix that is no IPv4 network or is too small.
    The fabric is named ``name``.
    """
    for what, prefix in (("rail prefix", rail_prefix), ("endpoint prefix", endpoint_prefix)):
        if prefix is not None:
            try:
                ipaddress.IPv4Network(prefix)
            except ValueError as exc:
                raise ValueError(f"{what} {prefix!r}: {exc}") from None
    return _Run(hosts, graph, rail_prefix, endpoint_prefix, gpus_per_host, name).run()
