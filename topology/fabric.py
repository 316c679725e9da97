"""The fabric model: hosts (their inventories), switches and links, plus a rail-optimized generator.

Consumes: a fabric file (JSON or YAML, :func:`load_fabric`) or generator parameters
(:func:`generate_rail_optimized`). Produces: a validated :class:`Fabric`, which the solver
(:mod:`linkguard.topology.solver`) turns into plans. Host inventories are the bus contract's
:class:`~linkguard.models.HostInventory`: one HCA port per rail with its rail address (the next hop
peers use), one /32 endpoint per GPU.

Link endpoint syntax: a host port is ``"<host>:<hca>/<port>"`` (``"gpu000:mlx5_3/1"``), a switch
port is the switch name (``"su0-leaf3"``).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from linkguard.models import HCAInfo, HostInventory, LinkLayer

__all__ = [
    "NDR_GBPS",
    "Fabric",
    "FabricError",
    "Link",
    "Switch",
    "dump_fabric",
    "generate_rail_optimized",
    "load_fabric",
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


class Link(_Model):
    """One cable. ``a``/``b`` are ``"<host>:<hca>/<port>"`` or switch names; rate in Gb/s."""

    a: str = Field(min_length=1, max_length=400)
    b: str = Field(min_length=1, max_length=400)
    kind: Literal["host-leaf", "leaf-spine"]
    rail: int | None = Field(None, ge=0, le=63)
    rate_gbps: float | None = Field(None, ge=0, le=100_000)


class Fabric(_Model):
    """A whole fabric. Validation (raises ``pydantic.ValidationError``, a ``ValueError``):

    - host names are unique; switch names are unique and distinct from host names;
    - every HCA has an ``address`` (peers use it as next hop) and all addresses, HCA and
      endpoint, are unique across the fabric;
    - at most 64 endpoints per host, at least one HCA when there are endpoints, and
      ``gpu_numa`` is empty or one entry per endpoint;
    - every link end names a known switch or an existing ``host:hca/port``.
    """

    name: str = Field(min_length=1, max_length=128)
    hosts: list[HostInventory] = Field(min_length=1)
    switches: list[Switch] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)

    _by_name: dict[str, HostInventory] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Fabric:
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
            if h.endpoints and not h.hcas:
                raise ValueError(f"host {h.host}: {len(h.endpoints)} endpoints but no HCA")
            for hca in h.hcas:
                if hca.address is None:
                    raise ValueError(
                        f"host {h.host}: HCA {hca.key} (rail {hca.rail}) has no address "
                        "(peers need it as next hop)"
                    )
                claim(hca.address, f"{h.host}:{hca.key}")
            for g, ep in enumerate(h.endpoints):
                claim(ep, f"{h.host} GPU {g} endpoint")
        switches: set[str] = set()
        for s in self.switches:
            if s.name in switches or s.name in seen:
                raise ValueError(f"duplicate switch name {s.name!r}")
            switches.add(s.name)
        ports = {f"{h.host}:{c.key}" for h in self.hosts for c in h.hcas}
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in switches and end not in ports:
                    raise ValueError(f"links[{i}]: unknown end {end!r} (no such switch or port)")
        self._by_name = seen
        return self

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


# --------------------------------------------------------------------------------------------
# Generator


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _rail_subnet_size(prefix: ipaddress.IPv4Network, hosts: int, rails: int) -> int:
    """Size of one rail's subnet (a power of two >= 256 holding hosts + network + broadcast)."""
    size = max(256, _pow2_at_least(hosts + 2))
    if size * rails > prefix.num_addresses:
        raise ValueError(
            f"rail prefix {prefix} too small: {rails} rails x {size} addresses for {hosts} hosts"
        )
    return size


def _endpoint_block(prefix: ipaddress.IPv4Network, hosts: int, gpus: int) -> int:
    """Addresses per host in the endpoint prefix: 256 when it fits, else the largest power of two
    that fits all hosts while keeping .0 and .255 unused (needs a block > gpus)."""
    block = 256
    while block * hosts > prefix.num_addresses and block // 2 > gpus:
        block //= 2
    if block * hosts > prefix.num_addresses:
        raise ValueError(f"endpoint prefix {prefix} too small for {hosts} hosts x {gpus} GPUs")
    return block


def generate_rail_optimized(
    *,
    hosts: int = 32,
    rails: int = 8,
    gpus_per_host: int | None = None,
    hosts_per_su: int = 32,
    spines: int = 4,
    endpoint_prefix: str = "10.200.0.0/16",
    rail_prefix: str = "10.100.0.0/16",
    host_name: str = "gpu{h:03d}",
    netdev: str = "rail{r}",
    hca: str = "mlx5_{r}",
    numa_split: bool = True,
    name: str | None = None,
) -> Fabric:
    """A rail-optimized fabric as in the NVIDIA DGX SuperPOD reference architecture
    (RA-11333-001, "DGX SuperPOD: Next Generation Scalable Infrastructure for AI Leadership,
    featuring DGX H100", compute fabric): scalable units (SU) of 32 hosts, one leaf per rail per SU
    (``su{s}-leaf{r}``: every host's rail-r HCA cables to its SU's rail-r leaf), 4 spines per SU
    (``su{s}-spine{k}``), NDR 400 Gb/s everywhere. Every leaf links to every spine (one
    :class:`Link` per leaf-spine pair; the RA bundles several parallel cables per pair and, beyond
    4 SUs, adds a core tier, which this model leaves out: the solver only uses hosts). Leaf-spine
    links therefore grow as leaves x spines: 32 for one SU, 147,456 for 2,048 hosts (~1 s).

    Hosts: ``host_name.format(h=h)``; HCA of rail r is ``hca.format(r=r)`` port 1, netdev
    ``netdev.format(r=r)``. ``gpus_per_host`` defaults to ``rails``; GPU g's home rail is
    ``g % rails``. With ``numa_split`` rails and GPUs in the lower half are on NUMA node 0 and the
    rest on node 1, as on DGX H100 (two CPU sockets, each with four GPUs and four of the eight
    ConnectX-7 compute NICs); otherwise all are on node 0.

    Address layout (matches the namespace lab for up to 254 hosts):

    - rail r, host h: ``rail_prefix`` is cut into one subnet per rail of ``size`` addresses,
      ``size`` = max(256, next power of two >= hosts + 2); host h is the (h+1)-th address of rail
      r's subnet. For <= 254 hosts that is ``10.100.r.(h+1)`` in ``10.100.r.0/24``; for 2,000 hosts
      each rail gets a /21 (``10.100.(8r).0/21``); a /16 holds 8 rails of up to 8,190 hosts.
    - endpoint of host h, GPU g: ``endpoint_prefix`` + h * block + g + 1 with block = 256 while
      hosts * 256 fits the prefix (``10.200.h.(g+1)``), else halved until it fits (>= gpus + 1),
      e.g. 32 per host for 2,048 hosts in a /16, which holds up to 4,096 hosts of 8 GPUs.
      Endpoints never end in .0 or .255.

    Raises ValueError on non-positive sizes or prefixes too small for the requested size.
    """
    gpus = rails if gpus_per_host is None else gpus_per_host
    if hosts < 1 or rails < 1 or gpus < 0 or hosts_per_su < 1 or spines < 0:
        raise ValueError("hosts, rails, hosts_per_su must be >= 1; gpus_per_host, spines >= 0")
    if rails > 64 or gpus > MAX_ENDPOINTS_PER_HOST:
        raise ValueError("at most 64 rails and 64 GPUs per host")
    rnet = ipaddress.IPv4Network(rail_prefix)
    enet = ipaddress.IPv4Network(endpoint_prefix)
    rsize = _rail_subnet_size(rnet, hosts, rails)
    block = _endpoint_block(enet, hosts, gpus)
    rbase = int(rnet.network_address)
    ebase = int(enet.network_address)
    half_r = rails / 2
    half_g = gpus / 2

    def numa(i: int, half: float) -> int:
        return (0 if i < half else 1) if numa_split else 0

    inventories: list[HostInventory] = []
    switches: list[Switch] = []
    links: list[Link] = []
    n_su = (hosts + hosts_per_su - 1) // hosts_per_su
    for s in range(n_su):
        switches.extend(
            Switch(name=f"su{s}-leaf{r}", role="leaf", rail=r, su=s) for r in range(rails)
        )
    for s in range(n_su):
        switches.extend(Switch(name=f"su{s}-spine{k}", role="spine", su=s) for k in range(spines))
    for h in range(hosts):
        hn = host_name.format(h=h)
        su = h // hosts_per_su
        hcas = []
        for r in range(rails):
            hcas.append(
                HCAInfo(
                    hca=hca.format(r=r),
                    port=1,
                    rail=r,
                    link_layer=LinkLayer.INFINIBAND,
                    netdev=netdev.format(r=r),
                    numa_node=numa(r, half_r),
                    address=ipaddress.IPv4Address(rbase + r * rsize + h + 1),
                )
            )
            links.append(
                Link(
                    a=f"{hn}:{hca.format(r=r)}/1",
                    b=f"su{su}-leaf{r}",
                    kind="host-leaf",
                    rail=r,
                    rate_gbps=NDR_GBPS,
                )
            )
        inventories.append(
            HostInventory(
                host=hn,
                hcas=hcas,
                endpoints=[ipaddress.IPv4Address(ebase + h * block + g + 1) for g in range(gpus)],
                gpu_numa=[numa(g, half_g) for g in range(gpus)],
            )
        )
    spine_names = [sw.name for sw in switches if sw.role == "spine"]
    for sw in switches:
        if sw.role == "leaf":
            links.extend(
                Link(a=sw.name, b=sp, kind="leaf-spine", rail=sw.rail, rate_gbps=NDR_GBPS)
                for sp in spine_names
            )
    return Fabric(
        name=name or f"rail-optimized-{hosts}x{rails}",
        hosts=inventories,
        switches=switches,
        links=links,
    )


# --------------------------------------------------------------------------------------------
# Files


def _summary(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for e in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


def load_fabric(path: str | Path) -> Fabric:
    """Read a fabric file: JSON for ``.json``, YAML for ``.yaml``/``.yml`` (safe loader).

    Raises :class:`FabricError` naming ``path`` when the file cannot be read, has another
    suffix, does not parse, is not a mapping, or fails validation (with a summary of the first
    pydantic errors: ``hosts.1.hcas.0.address: ...``).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise FabricError(f"{p}: unknown fabric file suffix {suffix!r} (use .json, .yaml, .yml)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FabricError(f"{p}: cannot read fabric file: {exc}") from exc
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise FabricError(f"{p}: not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise FabricError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise FabricError(
            f"{p}: expected a mapping with name/hosts/switches/links, got {type(data).__name__}"
        )
    try:
        return Fabric.model_validate(data)
    except ValidationError as exc:
        raise FabricError(f"{p}: invalid fabric: {_summary(exc)}") from None


def dump_fabric(fabric: Fabric, fmt: Literal["json", "yaml"] = "json") -> str:
    """Serialize ``fabric`` as JSON (indented) or YAML; :func:`load_fabric` reads either back.
    Raises ValueError on another ``fmt``."""
    data = fabric.model_dump(mode="json", exclude_none=True)
    if fmt == "json":
        return json.dumps(data, indent=1) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    raise ValueError(f"unknown fabric format {fmt!r} (json or yaml)")
