"""Rail-optimized fabrics after the NVIDIA DGX SuperPOD reference architectures.

Consumes: generator parameters (host count, rails, SU size, spines per SU, core tier).
Produces: a validated :class:`~linkguard.topology.fabric.Fabric` (hosts with rail addresses and
GPU endpoints, leaf / spine / core switches, one :class:`~linkguard.topology.fabric.Link` per
cable), and :class:`RailOptimizedShape`, the switch and cable counts of such a fabric without
building it.

Sources of the numbers:

- [H100 RA] "NVIDIA DGX SuperPOD: Next Generation Scalable Infrastructure for AI Leadership,
  Reference Architecture featuring NVIDIA DGX H100 Systems", RA-11333-001, section Network
  Fabrics, Table 4 "Compute fabric component count"
  (https://docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100/latest/network-fabrics.html):
  SUs of 32 node slots, 8 rail leaves and 4 spines per SU, NDR 400 Gb/s; 1 SU = 31 nodes,
  8 leaves, 4 spines, 256 spine-leaf cables; 2 SUs = 63 nodes, 16, 8, 512; 4 SUs = 127 nodes,
  32, 16, 1,024. The node counts are 32 x SUs - 1: one slot of the fabric is given to the UFM
  appliance. Partial SUs keep the full SU's leaves and leaf-spine cables.
- [B200 RA] "NVIDIA DGX SuperPOD: Reference Architecture featuring DGX B200", component table
  (https://docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-b200/latest/dgx-superpod-architecture.html):
  two tiers up to 8 SUs; from 16 SUs a core tier, e.g. 64 SUs = 512 leaves, 512 spines,
  256 core switches, 16,384 node-leaf, 16,384 leaf-spine and 16,384 spine-core cables.
- [Bring-up] NVIDIA "InfiniBand Cluster Bring-up Procedure", Acronyms
  (https://docs.nvidia.com/networking/display/IBClusterBringupProcedure/Acronyms): a spine-leaf
  group (SLG) has every spine cabled to every leaf of the group; a core group (CG) is the set of
  core switches that one spine position of every SLG connects to. The RA's "core" is what other
  NVIDIA documents call a "super spine".
- Quantum-2 QM9700 / NDR switches have 64 ports of 400 Gb/s (:data:`SWITCH_PORTS`).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Final

from linkguard.models import HCAInfo, HostInventory, LinkLayer
from linkguard.topology.fabricmodel import (
    MAX_ENDPOINTS_PER_HOST,
    NDR_GBPS,
    Fabric,
    Link,
    Switch,
)

__all__ = [
    "CORE_MIN_SUS",
    "DEFAULT_ENDPOINT_PREFIX",
    "DEFAULT_RAIL_PREFIX",
    "SWITCH_PORTS",
    "RailOptimizedShape",
    "default_prefix",
    "generate_rail_optimized",
    "rail_optimized_shape",
]

#: Ports of one NDR InfiniBand switch (Quantum-2 QM9700: 64 x 400 Gb/s); sizes the core groups.
SWITCH_PORTS = 64

#: From this many SUs the default (``core=None``) adds a core tier: the first row of the
#: [B200 RA] component table that has core switches.
CORE_MIN_SUS = 16

#: Default rail (HCA address) and GPU endpoint prefixes of :func:`generate_rail_optimized`:
#: as the namespace lab lays out (``10.100.r.h``, ``10.200.r.h``). Each /16 holds 8 rails of up
#: to 8,190 hosts (1 GPU per rail and host for the endpoints); bigger fabrics get the smallest
#: wider prefix around it (:func:`default_prefix`): a /14 for 16,384 hosts x 8 rails.
DEFAULT_RAIL_PREFIX: Final = "10.100.0.0/16"
DEFAULT_ENDPOINT_PREFIX: Final = "10.200.0.0/16"

#: Link kind of a spine-to-core cable. The fabric model has no "core" role: a core switch is a
#: spine (``role="spine"``) of no SU (``su=None``), cabled to SU spines by ``spine-spine`` links
#: (NVIDIA's "super spine").
SPINE_CORE_KIND: Final = "spine-spine"


@dataclass(frozen=True, slots=True)
class RailOptimizedShape:
    """Switch and cable counts of a rail-optimized fabric (see :func:`rail_optimized_shape`).

    Cables are counted one per cable, as :class:`Link` records them (parallel cables between the
    same two switches are separate links).
    """

    hosts: int
    rails: int
    hosts_per_su: int  #: node slots per SU, management slots included
    management_hosts_per_su: int  #: slots per SU reserved for management (left empty)
    sus: int
    spines_per_su: int
    core: bool
    leaves: int
    spines: int
    leaf_uplinks: int  #: uplink cables per leaf
    spine_uplinks: int  #: core-facing cables of the busiest spine (0 without core)
    core_groups: int
    cores_per_group: int
    host_leaf_cables: int
    leaf_spine_cables: int
    spine_core_cables: int

    @property
    def compute_hosts_per_su(self) -> int:
        return self.hosts_per_su - self.management_hosts_per_su

    @property
    def cores(self) -> int:
        return self.core_groups * self.cores_per_group


def rail_optimized_shape(
    *,
    hosts: int = 32,
    rails: int = 8,
    hosts_per_su: int = 32,
    management_hosts_per_su: int = 0,
    spines_per_su: int = 4,
    core: bool | None = None,
) -> RailOptimizedShape:
    """The counts :func:`generate_rail_optimized` builds for these parameters, without building.

    Tiers and counts (sources in the module docstring):

    - SUs = ceil(hosts / (hosts_per_su - management_hosts_per_su)); every SU, the last one too,
      gets ``rails`` leaves and ``spines_per_su`` spines.
    - Each leaf has U = max(hosts_per_su, spines_per_su) uplink cables (non-blocking: as many up
      as node slots down), spread round-robin so that no two spines it reaches differ by more
      than one cable.
    - Two tiers (no core): one spine-leaf group, every leaf cabled to every spine of the fabric,
      as the [H100 RA] builds up to 4 SUs and the [B200 RA] up to 8. This needs
      SUs x spines_per_su <= U (a leaf cannot reach more spines than it has uplinks).
    - Three tiers (core): each SU is its own spine-leaf group (leaves cabled to their SU's
      spines only); spine k of every SU has as many core-facing cables as leaf-facing ones and
      connects to every switch of core group k. There are ``spines_per_su`` core groups of
      G = min(u, ceil(SUs x u / 64)) switches, u being the spine's uplink count: a core has the
      64 ports of a QM9700 while SUs x u <= 64 x u, i.e. up to 64 SUs; beyond that G stays at u
      and each core's port count grows with the SUs (the RA stops at 64 SUs).
      At the defaults (8 rails, 32 slots, 4 spines per SU) u = 64 and cores = 4 x SUs:
      64 core switches at 16 SUs and 256 at 64 SUs, the [B200 RA]'s counts; its 8 spines per SU
      are ``spines_per_su=8`` (same core count, u = 32).
    - ``core=None`` (auto): a core tier from :data:`CORE_MIN_SUS` (16) SUs on, and whenever a
      two-tier fabric cannot be cabled (more than U spines: from 9 SUs at the defaults).

    Cable counts grow linearly with the fleet: leaf-spine = leaves x U, spine-core <= spines x u.

    Raises ValueError for sizes < 1 (spines_per_su < 0), ``management_hosts_per_su`` not below
    ``hosts_per_su``, no spines (``spines_per_su=0``: one leaf per rail, nothing above) with more
    than one SU (the SUs could not reach each other), ``core=True`` without spines, or
    ``core=False`` when two tiers cannot be cabled.
    """
    if hosts < 1 or rails < 1 or hosts_per_su < 1 or spines_per_su < 0:
        raise ValueError("hosts, rails, hosts_per_su must be >= 1; spines_per_su >= 0")
    if not 0 <= management_hosts_per_su < hosts_per_su:
        raise ValueError(
            f"management_hosts_per_su must be 0..{hosts_per_su - 1} (below hosts_per_su), "
            f"got {management_hosts_per_su}"
        )
    per_su = hosts_per_su - management_hosts_per_su
    sus = -(-hosts // per_su)
    if spines_per_su == 0 and sus > 1:
        raise ValueError(
            f"{hosts} hosts need {sus} SUs of {per_su}, and SUs without spines cannot reach "
            "each other: use spines_per_su >= 1, or at most one SU (hosts <= hosts_per_su - "
            "management_hosts_per_su)"
        )
    leaves = sus * rails
    spines = sus * spines_per_su
    uplinks = max(hosts_per_su, spines_per_su) if spines_per_su else 0
    two_tier_ok = spines <= uplinks
    if core is None:
        core = spines_per_su > 0 and (sus >= CORE_MIN_SUS or not two_tier_ok)
    elif core and spines_per_su == 0:
        raise ValueError("a core tier needs spines (spines_per_su >= 1)")
    elif not core and not two_tier_ok:
        raise ValueError(
            f"two tiers cannot be cabled: every leaf would need a cable to each of {spines} "
            f"spines but has {uplinks} uplinks; add the core tier or use fewer spines per SU"
        )
    spine_up = groups = per_group = spine_core = 0
    if core:
        spine_up = -(-rails * uplinks // spines_per_su)  # the busiest spine's downlinks
        spine_min = rails * uplinks // spines_per_su
        groups = spines_per_su
        per_group = max(1, min(spine_min, math.ceil(sus * spine_up / SWITCH_PORTS)))
        spine_core = sus * rails * uplinks  # every leaf-facing cable has a core-facing twin
    return RailOptimizedShape(
        hosts=hosts,
        rails=rails,
        hosts_per_su=hosts_per_su,
        management_hosts_per_su=management_hosts_per_su,
        sus=sus,
        spines_per_su=spines_per_su,
        core=core,
        leaves=leaves,
        spines=spines,
        leaf_uplinks=uplinks,
        spine_uplinks=spine_up,
        core_groups=groups,
        cores_per_group=per_group,
        host_leaf_cables=hosts * rails,
        leaf_spine_cables=leaves * uplinks,
        spine_core_cables=spine_core,
    )


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _needed_prefixlen(size: int, rails: int) -> int:
    """Length of the smallest prefix that holds ``rails`` blocks of ``size`` addresses."""
    return 32 - (_pow2_at_least(size * rails).bit_length() - 1)


def _too_small(what: str, prefix: ipaddress.IPv4Network, size: int, rails: int, for_: str) -> str:
    plen = _needed_prefixlen(size, rails)
    return (
        f"{what} {prefix} too small: {rails} rails x {size} addresses for {for_}: needs a "
        f"/{plen} or wider ({rails} x /{32 - (size.bit_length() - 1)}), e.g. "
        f"{_aligned(prefix.network_address, plen)}"
    )


def _aligned(addr: ipaddress.IPv4Address, plen: int) -> ipaddress.IPv4Network:
    """The /``plen`` that holds ``addr`` (``addr`` with its host bits cleared)."""
    return ipaddress.IPv4Network((addr, plen), strict=False)


def _rail_subnet_size(prefix: ipaddress.IPv4Network, hosts: int, rails: int) -> int:
    """Size of one rail's subnet (a power of two >= 256 holding hosts + network + broadcast);
    ValueError naming the prefix length needed when ``rails`` of them do not fit."""
    size = max(256, _pow2_at_least(hosts + 2))
    if size * rails > prefix.num_addresses:
        raise ValueError(_too_small("rail prefix", prefix, size, rails, f"{hosts} hosts"))
    return size


def default_prefix(base: str, addresses: int) -> ipaddress.IPv4Network:
    """``base`` (a /16, e.g. :data:`DEFAULT_RAIL_PREFIX`) when it holds ``addresses``, else
    the smallest prefix that does and contains ``base``'s network address (``base`` widened
    with its host bits cleared): 10.100.0.0/16 -> 10.100.0.0/14 for 262,144 addresses,
    10.96.0.0/13 for 524,288. Fabrics that fit in the /16 keep their addresses."""
    net = ipaddress.IPv4Network(base)
    if addresses <= net.num_addresses:
        return net
    plen = 32 - (_pow2_at_least(addresses).bit_length() - 1)
    return _aligned(net.network_address, plen)


def rail_subnets(
    prefix: ipaddress.IPv4Network, size: int, rails: int
) -> dict[int, ipaddress.IPv4Network]:
    """The subnet of each rail when ``prefix`` is cut into ``size``-address blocks, rail r
    taking the r-th (the layout of :func:`generate_rail_optimized` and the importer)."""
    plen = 32 - (size.bit_length() - 1)
    base = int(prefix.network_address)
    return {r: ipaddress.IPv4Network((base + r * size, plen)) for r in range(rails)}


def _endpoint_subnet_size(
    prefix: ipaddress.IPv4Network, hosts: int, per_host: int, rails: int
) -> int:
    """Size of one rail's endpoint subnet: a power of two >= 256 holding ``hosts * per_host``
    endpoints plus network and broadcast; ValueError naming the prefix length needed when
    ``rails`` of them do not fit."""
    size = max(256, _pow2_at_least(hosts * per_host + 2))
    if size * rails > prefix.num_addresses:
        raise ValueError(
            _too_small(
                "endpoint prefix", prefix, size, rails, f"{hosts} hosts x {per_host} GPUs per rail"
            )
        )
    return size


def _spread(cables: int, targets: int, offset: int) -> list[int]:
    """Cables per target when ``cables`` go round-robin over ``targets`` starting at ``offset``:
    counts differ by at most one, and consecutive offsets balance the targets' totals."""
    base, extra = divmod(cables, targets)
    return [base + (1 if (t - offset) % targets < extra else 0) for t in range(targets)]


def generate_rail_optimized(
    *,
    hosts: int = 32,
    rails: int = 8,
    gpus_per_host: int | None = None,
    hosts_per_su: int = 32,
    management_hosts_per_su: int = 0,
    spines_per_su: int = 4,
    core: bool | None = None,
    endpoint_prefix: str | None = None,
    rail_prefix: str | None = None,
    host_name: str = "gpu{h:03d}",
    netdev: str = "rail{r}",
    hca: str = "mlx5_{r}",
    numa_split: bool = True,
    rails_per_pcie_switch: int = 0,
    name: str | None = None,
) -> Fabric:
    """A rail-optimized fabric of ``hosts`` compute hosts after the DGX SuperPOD reference
    architectures (module docstring), NDR 400 Gb/s on every cable.

    Switches (tiers and counts: :func:`rail_optimized_shape`):

    - leaf ``su{s}-leaf{r}`` (``role="leaf"``, ``rail=r``, ``su=s``): every host of SU s cables
      its rail-r HCA to it (one ``host-leaf`` link per host and rail);
    - spine ``su{s}-spine{k}`` (``role="spine"``, ``su=s``), k < ``spines_per_su``;
    - core ``cg{k}-core{j}`` (``role="spine"``, ``su=None``): switch j of core group k, present
      with the core tier.

    Links are one per cable: each leaf has ``leaf_uplinks`` ``leaf-spine`` links (rail = the
    leaf's), spread evenly over its spines; with the core tier each spine has as many
    ``spine-spine`` links to its core group (a = spine, b = core). Parallel cables are equal
    :class:`Link` records.

    Hosts fill SUs in order: host h is in SU h // (hosts_per_su - management_hosts_per_su); the
    last ``management_hosts_per_su`` slots of every SU stay empty (the RA gives one slot to the
    UFM appliance; its node counts, 31/63/95/127, reserve one slot per fabric, not per SU).
    Host h is named ``host_name.format(h=h)``; the HCA of rail r is ``hca.format(r=r)`` port 1,
    netdev ``netdev.format(r=r)``. ``gpus_per_host`` defaults to ``rails``. With ``numa_split``
    rails and GPUs in the lower half are on NUMA node 0 and the rest on node 1, as on DGX H100
    (two sockets, each with four GPUs and four of the eight ConnectX-7 compute NICs); otherwise
    all are on node 0.

    PCIe layout (the solver's first preference for alternates, see
    :mod:`linkguard.topology.solver`): ``rails_per_pcie_switch`` = k > 0 puts the HCAs of rails
    ``s*k .. s*k+k-1`` on PCIe switch ``pcie{s}`` and every GPU on the switch (and NUMA node) of
    its home rail's HCA, e.g. k = 2 for a DGX A100-like host (4 switches, each with two GPUs and
    two compute NICs); 0 (the default) leaves switch ids unset (None).

    Address layout (matches the namespace lab for up to 254 hosts; independent of SUs and
    management slots). ``rail_prefix`` / ``endpoint_prefix`` default (None) to
    :data:`DEFAULT_RAIL_PREFIX` / :data:`DEFAULT_ENDPOINT_PREFIX` (10.100.0.0/16, 10.200.0.0/16)
    while those hold the fabric (8 rails: up to 8,190 hosts), else to the smallest prefix around
    them that does (:func:`default_prefix`: 16,384 hosts x 8 rails -> 10.100.0.0/14 and
    10.200.0.0/14; agents then need ``endpoint_prefixes: [10.200.0.0/14]``). A prefix that is
    given is used as is, and one too small is an error naming the length needed:

    - rail r, host h: ``rail_prefix`` is cut into one subnet per rail of ``size`` addresses,
      ``size`` = max(256, next power of two >= hosts + 2); host h is the (h+1)-th address of rail
      r's subnet. For <= 254 hosts that is ``10.100.r.(h+1)`` in ``10.100.r.0/24``; for 2,000 hosts
      each rail gets a /21 (``10.100.(8r).0/21``); a /16 holds 8 rails of up to 8,190 hosts;
      16,384 hosts get a /17 per rail (``10.100.0.0/14``: ``10.(100 + r // 2).(128 * (r % 2)).0``).
    - endpoints are rail-major (``Fabric.endpoint_subnets``, so plans need one prefix route per
      rail): GPU g's home rail is r = g % rails and its rank j = g // rails; ``endpoint_prefix``
      is cut into one subnet per rail of ``esize`` = max(256, next power of two >= hosts * k +
      2) addresses (k = GPUs per rail and host, rounded up) and the endpoint is the
      (h * k + j + 1)-th address of rail r's. For <= 254 hosts of 8 GPUs on 8 rails that is
      ``10.200.r.(h+1)`` in ``10.200.r.0/24``; for 2,048 hosts each rail gets a /20, for 16,384
      a /17 (in ``10.200.0.0/14``).

    Raises ValueError on bad sizes (see :func:`rail_optimized_shape`), more than 64 rails or GPUs
    per host, prefixes too small for the requested size, a negative ``rails_per_pcie_switch``,
    or one whose switches would hold rails of both NUMA nodes (with ``numa_split``).
    """
    gpus = rails if gpus_per_host is None else gpus_per_host
    if gpus < 0:
        raise ValueError("gpus_per_host must be >= 0")
    if rails_per_pcie_switch < 0:
        raise ValueError("rails_per_pcie_switch must be >= 0 (0: no PCIe switch ids)")
    if rails > 64 or gpus > MAX_ENDPOINTS_PER_HOST:
        raise ValueError("at most 64 rails and 64 GPUs per host")
    shape = rail_optimized_shape(
        hosts=hosts,
        rails=rails,
        hosts_per_su=hosts_per_su,
        management_hosts_per_su=management_hosts_per_su,
        spines_per_su=spines_per_su,
        core=core,
    )
    per_rail = -(-gpus // rails) if rails else 0
    rnet, enet = _prefixes(rail_prefix, endpoint_prefix, hosts, rails, per_rail)
    rsize = _rail_subnet_size(rnet, hosts, rails)
    esize = _endpoint_subnet_size(enet, hosts, per_rail, rails)
    return Fabric(
        name=name or f"rail-optimized-{hosts}x{rails}",
        hosts=_hosts(
            hosts,
            rails,
            gpus,
            rnet,
            enet,
            rsize,
            esize,
            host_name,
            netdev,
            hca,
            numa_split,
            rails_per_pcie_switch,
        ),
        switches=_switches(shape),
        links=_host_links(shape, host_name, hca) + _fabric_links(shape),
        rail_subnets=rail_subnets(rnet, rsize, rails),
        endpoint_subnets=rail_subnets(enet, esize, rails) if gpus else {},
    )


def _prefixes(
    rail_prefix: str | None, endpoint_prefix: str | None, hosts: int, rails: int, per_rail: int
) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """The rail and endpoint prefixes: the given ones, or the defaults widened to fit
    (:func:`default_prefix`); ValueError when two widened defaults would overlap."""
    rsize = max(256, _pow2_at_least(hosts + 2))
    esize = max(256, _pow2_at_least(hosts * per_rail + 2))
    rnet = (
        ipaddress.IPv4Network(rail_prefix)
        if rail_prefix is not None
        else default_prefix(DEFAULT_RAIL_PREFIX, rsize * rails)
    )
    enet = (
        ipaddress.IPv4Network(endpoint_prefix)
        if endpoint_prefix is not None
        else default_prefix(DEFAULT_ENDPOINT_PREFIX, esize * rails)
    )
    if rnet.overlaps(enet) and (rail_prefix is None or endpoint_prefix is None):
        raise ValueError(
            f"{hosts} hosts x {rails} rails do not fit the default prefixes (rail {rnet}, "
            f"endpoint {enet} would overlap): give rail_prefix and endpoint_prefix"
        )
    return rnet, enet


def _hosts(
    hosts: int,
    rails: int,
    gpus: int,
    rnet: ipaddress.IPv4Network,
    enet: ipaddress.IPv4Network,
    rsize: int,
    esize: int,
    host_name: str,
    netdev: str,
    hca: str,
    numa_split: bool,
    per_switch: int = 0,
) -> list[HostInventory]:
    rbase = int(rnet.network_address)
    ebase = int(enet.network_address)

    def numa(i: int, n: int) -> int:
        return (0 if i < n / 2 else 1) if numa_split else 0

    rail_numa = [numa(r, rails) for r in range(rails)]
    gpu_numa: list[int | None] = [numa(g, gpus) for g in range(gpus)]
    rail_switch: list[str | None] = [None] * rails
    gpu_switch: list[str | None] = []
    if per_switch:
        rail_switch = [f"pcie{r // per_switch}" for r in range(rails)]
        for r in range(rails):
            first = (r // per_switch) * per_switch
            if rail_numa[r] != rail_numa[first]:
                raise ValueError(
                    f"rails_per_pcie_switch={per_switch} puts rails {first} and {r} (NUMA nodes "
                    f"{rail_numa[first]} and {rail_numa[r]}) on one PCIe switch: use a divisor "
                    f"of {rails // 2} (each NUMA node holds half the rails)"
                )
        if rails:  # a GPU sits on its home rail's switch, so on that HCA's NUMA node
            gpu_switch = [rail_switch[g % rails] for g in range(gpus)]
            gpu_numa = [rail_numa[g % rails] for g in range(gpus)]
    hca_names = [hca.format(r=r) for r in range(rails)]
    netdevs = [netdev.format(r=r) for r in range(rails)]
    IP = ipaddress.IPv4Address
    per_rail = -(-gpus // rails) if rails else 0

    def endpoint(h: int, g: int) -> ipaddress.IPv4Address:
        r, j = g % rails, g // rails
        return IP(ebase + r * esize + h * per_rail + j + 1)

    return [
        HostInventory(
            host=host_name.format(h=h),
            hcas=[
                HCAInfo(
                    hca=hca_names[r],
                    port=1,
                    rail=r,
                    link_layer=LinkLayer.INFINIBAND,
                    netdev=netdevs[r],
                    numa_node=rail_numa[r],
                    pcie_switch=rail_switch[r],
                    address=IP(rbase + r * rsize + h + 1),
                )
                for r in range(rails)
            ],
            endpoints=[endpoint(h, g) for g in range(gpus)],
            gpu_numa=gpu_numa,
            gpu_pcie_switch=gpu_switch,
        )
        for h in range(hosts)
    ]


def _leaf(s: int, r: int) -> str:
    return f"su{s}-leaf{r}"


def _spine(s: int, k: int) -> str:
    return f"su{s}-spine{k}"


def _core(k: int, j: int) -> str:
    return f"cg{k}-core{j}"


def _switches(shape: RailOptimizedShape) -> list[Switch]:
    out = [
        Switch(name=_leaf(s, r), role="leaf", rail=r, su=s)
        for s in range(shape.sus)
        for r in range(shape.rails)
    ]
    out += [
        Switch(name=_spine(s, k), role="spine", su=s)
        for s in range(shape.sus)
        for k in range(shape.spines_per_su)
    ]
    out += [
        Switch(name=_core(k, j), role="spine")
        for k in range(shape.core_groups)
        for j in range(shape.cores_per_group)
    ]
    return out


def _host_links(shape: RailOptimizedShape, host_name: str, hca: str) -> list[Link]:
    per_su = shape.compute_hosts_per_su
    ends = [f"{hca.format(r=r)}/1" for r in range(shape.rails)]
    return [
        Link(
            a=f"{host_name.format(h=h)}:{ends[r]}",
            b=_leaf(h // per_su, r),
            kind="host-leaf",
            rail=r,
            rate_gbps=NDR_GBPS,
        )
        for h in range(shape.hosts)
        for r in range(shape.rails)
    ]


def _fabric_links(shape: RailOptimizedShape) -> list[Link]:
    """Leaf-spine and spine-core cables. Parallel cables share one (frozen) Link object."""
    links: list[Link] = []
    up = shape.leaf_uplinks
    if not up:
        return links
    # spine -> cables from each leaf; spine downlinks, for the core tier
    spine_down: dict[str, int] = {}
    for s in range(shape.sus):
        if shape.core:
            spines = [_spine(s, k) for k in range(shape.spines_per_su)]
        else:
            spines = [_spine(t, k) for t in range(shape.sus) for k in range(shape.spines_per_su)]
        for r in range(shape.rails):
            # within a SU leaf r starts where leaf r-1 ended: spines' totals stay within one
            offset = ((r if shape.core else s * shape.rails + r) * up) % len(spines)
            leaf = _leaf(s, r)
            for spine, n in zip(spines, _spread(up, len(spines), offset), strict=True):
                if n:
                    link = Link(a=leaf, b=spine, kind="leaf-spine", rail=r, rate_gbps=NDR_GBPS)
                    links.extend([link] * n)
                    spine_down[spine] = spine_down.get(spine, 0) + n
    if not shape.core:
        return links
    g = shape.cores_per_group
    for s in range(shape.sus):
        for k in range(shape.spines_per_su):
            spine = _spine(s, k)
            n_up = spine_down[spine]
            for j, n in enumerate(_spread(n_up, g, (s * n_up) % g)):
                link = Link(a=spine, b=_core(k, j), kind=SPINE_CORE_KIND, rate_gbps=NDR_GBPS)
                links.extend([link] * n)
    return links
