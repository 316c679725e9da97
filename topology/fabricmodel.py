"""The fabric model: hosts (their inventories), switches and links, validated; and the checks
on a whole fabric (switch tiers, home rails, whether the service can serve it).

Consumes: a fabric document (a mapping, or keyword arguments) from the files
:mod:`linkguard.topology.fabric` reads or from :mod:`linkguard.topology.generator`. Produces:
a validated :class:`Fabric`.
Host inventories are the bus contract's :class:`~linkguard.models.HostInventory`: one HCA port
per rail with its rail address (the next hop peers use), one /32 endpoint per GPU. It sits below
both the generator and the file reader (:mod:`linkguard.topology.fabric`, which re-exports every
name here), so neither imports the other's importer.

Link endpoint syntax: a host port is ``"<host>:<hca>/<port>"`` (``"gpu000:mlx5_3/1"``), a switch
port is the switch name (``"su0-leaf3"``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from linkguard.models import HostInventory, RailIndex

__all__ = [
    "MAX_ENDPOINTS_PER_HOST",
    "NDR_GBPS",
    "Fabric",
    "FabricError",
    "Link",
    "Switch",
    "Tier",
    "check_servable",
    "home_rails",
    "serving_problems",
    "switch_tiers",
]

#: NDR InfiniBand port rate in Gb/s (4X NDR, 400 Gb/sec as the sysfs ``rate`` file prints it), the
#: compute-fabric rate of the DGX SuperPOD H100 reference architecture.
NDR_GBPS = 400.0

#: Upper bound on endpoints (GPUs) per host, as in ``HostInventory.endpoints``.
MAX_ENDPOINTS_PER_HOST = 64


class FabricError(ValueError):
    """A fabric file or fabric description that cannot be used; the message names the source."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class Switch(_Model):
    """One switch: a rail leaf (``rail`` and ``su`` set) or a spine (``rail`` None)."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    role: Literal["leaf", "spine"]
    rail: int | None = Field(None, ge=0, le=63)
    su: int | None = Field(None, ge=0, description="scalable unit index")
    guid: str | None = Field(
        None, pattern=r"^[0-9a-f]{16}$", description="node GUID, 16 hex digits (ibnetdiscover)"
    )
    description: str | None = Field(
        None, max_length=256, description="NodeDescription as ibnetdiscover prints it"
    )


class Link(_Model):
    """One cable. ``a``/``b`` are ``"<host>:<hca>/<port>"`` or switch names; rate in Gb/s.

    ``leaf-leaf`` and ``spine-spine`` are switch-to-switch cables an imported fabric can have
    (ibsim's two-leaf examples; a spine tier cabled to another spine). Parallel cables between the
    same pair are separate links, told apart by ``a_port``/``b_port``.
    """

    a: str = Field(min_length=1, max_length=400)
    b: str = Field(min_length=1, max_length=400)
    kind: Literal["host-leaf", "leaf-spine", "leaf-leaf", "spine-spine"]
    rail: int | None = Field(None, ge=0, le=63)
    rate_gbps: float | None = Field(None, ge=0, le=100_000)
    a_port: int | None = Field(None, ge=1, le=255, description="port number at end a")
    b_port: int | None = Field(None, ge=1, le=255, description="port number at end b")
    width: Literal["1x", "2x", "4x", "8x", "12x"] | None = Field(
        None, description="active link width (IBA PortInfo.LinkWidthActive), e.g. 4x"
    )
    speed: Literal["SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR"] | None = Field(
        None, description="active lane speed as ibnetdiscover prints it, e.g. QDR"
    )


class Fabric(_Model):
    """A whole fabric. Validation (raises ``pydantic.ValidationError``, a ``ValueError``):

    - host names are unique; switch names are unique and distinct from host names;
    - every HCA has an ``address`` (peers use it as next hop) and all addresses, HCA and
      endpoint, are unique across the fabric;
    - at most 64 endpoints per host, at least one HCA when there are endpoints, and
      ``gpu_numa`` and ``gpu_pcie_switch`` are each empty or one entry per endpoint; no two HCAs
      of a host share a ``netdev``; the GPUs and HCAs of one PCIe switch (``pcie_switch``) are
      on one NUMA node where it is known (a switch hangs off one root port);
    - ``rail_subnets`` and ``endpoint_subnets`` are keyed by rails 0..63, their networks have
      no host bits set, and no two subnets (of either kind) overlap;
    - when ``rail_subnets`` is given, every rail that has an HCA has a subnet, and every HCA
      address is a host address of its rail's subnet (``endpoint_subnets`` likewise: every
      GPU's home rail has one, holding the endpoint);
    - every link end names a known switch or an existing ``host:hca/port``; a link's two ends
      differ, and an HCA port is cabled once;
    - a ``host-leaf`` link's ``rail`` and its leaf's ``rail`` (where set) are the HCA's rail.
      Validated with the context ``{"observed": True}`` (``load_fabric(path, observed=True)``,
      ``Fabric.model_validate(data, context={"observed": True})``), a fabric as found may have
      an HCA cabled to another rail's leaf (what the audit reports as ``wrong_rail``); every
      other check still applies.
    """

    name: str = Field(min_length=1, max_length=128)
    hosts: list[HostInventory] = Field(min_length=1)
    switches: list[Switch] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    rail_subnets: dict[RailIndex, ipaddress.IPv4Network] = Field(
        default_factory=dict,
        description="each rail's subnet; when given, every HCA address must lie inside its "
        "rail's subnet (peers use it as an on-link next hop)",
    )
    endpoint_subnets: dict[RailIndex, ipaddress.IPv4Network] = Field(
        default_factory=dict,
        description="rail-major endpoint addressing: rail r's subnet holds every GPU endpoint "
        "whose home rail is r; when given, plans carry one prefix route per rail and /32 "
        "routes only for exceptions",
    )

    _by_name: dict[str, HostInventory] = PrivateAttr(default_factory=dict)

    @field_validator("rail_subnets", "endpoint_subnets", mode="before")
    @classmethod
    def _no_host_bits(cls, value: object, info: ValidationInfo) -> object:
        """Say "host bits set" where pydantic would only say "not a valid IPv4 network"."""
        if not isinstance(value, dict):
            return value
        for rail, net in value.items():
            if not isinstance(net, str):
                continue
            try:
                ipaddress.IPv4Network(net.strip())
            except ValueError:
                try:
                    loose = ipaddress.IPv4Network(net.strip(), strict=False)
                except ValueError:
                    continue  # not a network at all: pydantic's own message
                what = "endpoint subnet" if info.field_name == "endpoint_subnets" else "subnet"
                raise ValueError(
                    f"rail {rail}'s {what} {net.strip()} has host bits set (the network is {loose})"
                ) from None
        return value

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Fabric:
        observed = bool(info.context and info.context.get("observed"))
        self._check_subnets_overlap()
        seen: dict[str, HostInventory] = {}
        for h in self.hosts:
            if h.host in seen:
                raise ValueError(f"duplicate host {h.host!r}")
            seen[h.host] = h
        owner: dict[ipaddress.IPv4Address, str] = {}

        def claim(addr: ipaddress.IPv4Address, what: str) -> None:
            if addr in owner:
                raise ValueError(f"duplicate address {addr}: {owner[addr]} and {what}")
            owner[addr] = what

        for h in self.hosts:
            if len(h.endpoints) > MAX_ENDPOINTS_PER_HOST:
                raise ValueError(f"host {h.host}: {len(h.endpoints)} endpoints > 64")
            if h.gpu_numa and len(h.gpu_numa) != len(h.endpoints):
                raise ValueError(
                    f"host {h.host}: gpu_numa has {len(h.gpu_numa)} entries for "
                    f"{len(h.endpoints)} endpoints"
                )
            _check_switches(h)
            if h.endpoints and not h.hcas:
                raise ValueError(f"host {h.host}: {len(h.endpoints)} endpoints but no HCA")
            by_netdev: dict[str, str] = {}
            for hca in h.hcas:
                if hca.netdev is None:
                    continue
                other = by_netdev.setdefault(hca.netdev, hca.key)
                if other != hca.key:
                    raise ValueError(
                        f"host {h.host}: HCAs {other} and {hca.key} both have netdev "
                        f"{hca.netdev!r} (each HCA port has its own netdev)"
                    )
            for hca in h.hcas:
                if hca.address is None:
                    raise ValueError(
                        f"host {h.host}: HCA {hca.key} (rail {hca.rail}) has no address "
                        "(peers need it as next hop)"
                    )
                claim(hca.address, f"{h.host}:{hca.key}")
                net = self.rail_subnets.get(hca.rail)
                if net is None and self.rail_subnets:  # partial: some next hops unchecked
                    have = ", ".join(str(r) for r in sorted(self.rail_subnets))
                    raise ValueError(
                        f"rail {hca.rail} has no entry in rail_subnets (host {h.host}: HCA "
                        f"{hca.key} is on it; there are subnets for rails {have}): give every "
                        "rail's subnet, or none"
                    )
                if net is not None and (
                    hca.address not in net
                    or hca.address in (net.network_address, net.broadcast_address)
                ):
                    raise ValueError(
                        f"host {h.host}: HCA {hca.key} address {hca.address} is not a host "
                        f"address of rail {hca.rail}'s subnet {net}"
                    )
            for g, ep in enumerate(h.endpoints):
                claim(ep, f"{h.host} GPU {g} endpoint")
        self._check_endpoint_subnets()
        switches: set[str] = set()
        for s in self.switches:
            if s.name in switches or s.name in seen:
                raise ValueError(f"duplicate switch name {s.name!r}")
            switches.add(s.name)
        ports = {f"{h.host}:{c.key}": c for h in self.hosts for c in h.hcas}
        leaf_rail = {s.name: s.rail for s in self.switches if s.role == "leaf"}
        cabled: dict[str, int] = {}  # host port -> the link that cables it
        for i, link in enumerate(self.links):
            if link.a == link.b:
                raise ValueError(
                    f"links[{i}]: both ends are {link.a!r} (a cable joins two different ends)"
                )
            for end in (link.a, link.b):
                if end not in switches and end not in ports:
                    raise ValueError(f"links[{i}]: unknown end {end!r} (no such switch or port)")
                if end in ports:
                    j = cabled.setdefault(end, i)
                    if j != i:
                        raise ValueError(
                            f"links[{i}]: HCA port {end} is already cabled by links[{j}] "
                            f"({self.links[j].a} - {self.links[j].b}); an HCA port takes one "
                            "cable"
                        )
            if link.kind != "host-leaf":
                continue
            cabled_hca = ports.get(link.a) or ports.get(link.b)
            leaf = link.b if link.a in ports else link.a
            rails = {"link": link.rail, "leaf": None if observed else leaf_rail.get(leaf)}
            for what, rail in rails.items():
                if cabled_hca is not None and rail is not None and rail != cabled_hca.rail:
                    hint = " Only an observed fabric may be, as `fabric audit --fabric` reads it"
                    raise ValueError(
                        f"links[{i}] {link.a} - {link.b}: the HCA is on rail {cabled_hca.rail} "
                        f"but the {what} says rail {rail} (cabled to another rail's leaf?"
                        f"{hint if what == 'leaf' else ''})"
                    )
        self._by_name = seen
        return self

    def _check_subnets_overlap(self) -> None:
        """No two rail subnets, endpoint subnets, or one of each, overlap."""
        for what, subnets in (("rail", self.rail_subnets), ("endpoint", self.endpoint_subnets)):
            nets = sorted(subnets.items())
            for i, (ra, a) in enumerate(nets):
                for rb, b in nets[i + 1 :]:
                    if a.overlaps(b):
                        raise ValueError(
                            f"{what} subnets of rails {ra} ({a}) and {rb} ({b}) overlap (each "
                            "rail needs its own)"
                        )
        for ra, a in sorted(self.endpoint_subnets.items()):
            for rr, rn in sorted(self.rail_subnets.items()):
                if a.overlaps(rn):
                    raise ValueError(
                        f"endpoint subnet of rail {ra} ({a}) overlaps rail {rr}'s subnet {rn}"
                    )

    def _check_endpoint_subnets(self) -> None:
        if not self.endpoint_subnets:
            return
        for h in self.hosts:
            for g, (ep, rail) in enumerate(zip(h.endpoints, home_rails(h), strict=True)):
                net = self.endpoint_subnets.get(rail)
                if net is None:
                    raise ValueError(
                        f"host {h.host}: GPU {g}'s home rail {rail} has no endpoint subnet"
                    )
                if ep not in net:
                    raise ValueError(
                        f"host {h.host}: GPU {g} endpoint {ep} is not in its home rail {rail}'s "
                        f"endpoint subnet {net}"
                    )

    def host(self, name: str) -> HostInventory:
        """The inventory of host ``name``; KeyError naming the host and the fabric if unknown."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in fabric {self.name!r}") from None

    @property
    def host_names(self) -> list[str]:
        """Host names in fabric order (the order the solver indexes peers by)."""
        return [h.host for h in self.hosts]

    @property
    def rails(self) -> list[int]:
        """Sorted rail indices present on any host."""
        return sorted({c.rail for h in self.hosts for c in h.hcas})


def _check_switches(h: HostInventory) -> None:
    """``gpu_pcie_switch`` has one entry per endpoint (or none); every PCIe switch of ``h`` has
    its devices on at most one known NUMA node."""
    if h.gpu_pcie_switch and len(h.gpu_pcie_switch) != len(h.endpoints):
        raise ValueError(
            f"host {h.host}: gpu_pcie_switch has {len(h.gpu_pcie_switch)} entries for "
            f"{len(h.endpoints)} endpoints"
        )
    nodes: dict[str, dict[int, str]] = {}
    devices = [(f"HCA {c.key}", c.pcie_switch, c.numa_node) for c in h.hcas]
    devices += [
        (f"GPU {g}", sw, h.gpu_numa[g] if g < len(h.gpu_numa) else None)
        for g, sw in enumerate(h.gpu_pcie_switch)
    ]
    for what, sw, numa in devices:
        if sw is None or numa is None or numa < 0:
            continue
        seen = nodes.setdefault(sw, {})
        seen.setdefault(numa, what)
        if len(seen) > 1:
            (na, wa), (nb, wb) = sorted(seen.items())[:2]
            raise ValueError(
                f"host {h.host}: PCIe switch {sw!r} has {wa} on NUMA node {na} and {wb} on "
                f"node {nb} (a switch hangs off one root port, so one node)"
            )


Tier = Literal["leaf", "spine", "core"]


def switch_tiers(fabric: Fabric) -> dict[str, Tier]:
    """Tier of every switch, by name: a ``leaf`` switch is a leaf; a ``spine`` switch is
    ``core`` when it has ``spine-spine`` links but no ``leaf-spine`` link (the generator's core
    tier, an imported "super spine"), else ``spine``."""
    to_leaf: set[str] = set()
    to_spine: set[str] = set()
    for link in fabric.links:
        if link.kind == "leaf-spine":
            to_leaf.update((link.a, link.b))
        elif link.kind == "spine-spine":
            to_spine.update((link.a, link.b))

    def tier(s: Switch) -> Tier:
        if s.role == "leaf":
            return "leaf"
        return "core" if s.name in to_spine and s.name not in to_leaf else "spine"

    return {s.name: tier(s) for s in fabric.switches}


def home_rails(inv: HostInventory) -> list[int]:
    """Home rail of each GPU of ``inv`` (index = GPU): the ``g % n``-th of the host's n sorted
    rails, i.e. rail ``g % R`` on a regular fabric (GPU g sits next to the rail-g NIC in the
    DGX rail-optimized layout). Empty when the host has no HCA."""
    rails = sorted(c.rail for c in inv.hcas)
    if not rails:
        return []
    return [rails[g % len(rails)] for g in range(len(inv.endpoints))]


def serving_problems(fabric: Fabric, *, shown: int = 3) -> list[str]:
    """Why the topology service could not give ``fabric``'s hosts plans they can apply: one
    sentence per problem, naming the first ``shown`` HCAs (``host:hca/port``) or hosts; an empty
    list when there is none. Problems: an HCA without ``netdev`` (a plan's routes leave by their
    rail's netdev; agents refuse a plan that names none) and a host without GPU ``endpoints``
    (plans route only to endpoints: a fabric without them gives plans without routes, and
    agents delete the routes they have). A fabric imported from ibnetdiscover has neither; a
    valid :class:`Fabric` may lack them."""

    def first(items: list[str]) -> str:
        more = f" and {len(items) - shown} more" if len(items) > shown else ""
        return ", ".join(items[:shown]) + more

    no_netdev = [f"{h.host}:{c.key}" for h in fabric.hosts for c in h.hcas if c.netdev is None]
    no_endpoints = [h.host for h in fabric.hosts if not h.endpoints]
    out = []
    if no_netdev:
        out.append(
            f"{len(no_netdev)} HCA port(s) without a netdev ({first(no_netdev)}): set each "
            "HCA's netdev (the interface its rail's routes leave by, e.g. ib0 or ens3np0)"
        )
    if no_endpoints:
        out.append(
            f"{len(no_endpoints)} host(s) without GPU endpoints ({first(no_endpoints)}): set "
            "each host's endpoints (one address per GPU, index = GPU)"
        )
    return out


def check_servable(fabric: Fabric, source: str | Path) -> Fabric:
    """``fabric`` when :func:`serving_problems` finds nothing; else raises :class:`FabricError`
    naming ``source`` (the fabric file), the problems and how to fix them."""
    problems = serving_problems(fabric)
    if problems:
        raise FabricError(
            f"{source}: the topology service cannot serve this fabric: {'; '.join(problems)}. "
            "A fabric imported from ibnetdiscover has neither: fill in the netdevs and "
            "endpoints (or generate one with `linkguard fabric generate`)"
        )
    return fabric
