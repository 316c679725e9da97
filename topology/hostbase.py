"""Per-host base assignment: the part of a host's plan that depends on that host alone.

Consumes a :class:`~linkguard.topology.fabric.Fabric` (each host indexed once as an
:class:`IndexedHost`) and, per host, the rails it can use and the fabric's *degraded* rails.
Produces the host's :class:`HostBase`: its GPU -> rail assignments (home HCA, else one on the
GPU's PCIe switch, then NUMA node, then the least loaded, then the lowest rail), its prefix
routes (on-link, else multipath over the usable rails that are not degraded, else
``unreachable``) and, per usable local rail, the changes of both if that rail went down too (the
backups). The rules are the solver's (:mod:`linkguard.topology.solver`, module docstring).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from ipaddress import IPv4Network

from linkguard.models import HCAInfo, HostInventory, PrefixRoute
from linkguard.topology.fabric import Fabric, home_rails

__all__ = [
    "HostBase",
    "HostBases",
    "IndexedHost",
    "index_hosts",
    "multipath_rails",
    "rail_choices",
]


@dataclass(frozen=True, slots=True)
class IndexedHost:
    """One host of the fabric as the solver indexes it: position in fabric order, sorted rails,
    HCA per rail, home rail, NUMA node and PCIe switch per GPU, and its hardware signature."""

    inv: HostInventory
    pos: int
    rails: tuple[int, ...]  # sorted
    by_rail: dict[int, HCAInfo]
    home: tuple[int, ...]  # home rail per GPU
    gpu_numa: tuple[int | None, ...]
    gpu_switch: tuple[str | None, ...]  # PCIe switch per GPU
    # per GPU: (rank among the GPUs homed on the same rail, number of GPUs homed on that rail)
    rank: tuple[tuple[int, int], ...]
    # what the choice of a route depends on besides the usable sets: rail, netdev, NUMA node,
    # PCIe switch
    sig: tuple[tuple[int, str | None, int | None, str | None], ...]
    rail_set: frozenset[int]
    home_set: frozenset[int]


def index_hosts(fabric: Fabric) -> list[IndexedHost]:
    """Every host of ``fabric`` as an :class:`IndexedHost`, in fabric order."""
    out = []
    for pos, inv in enumerate(fabric.hosts):
        by_rail = {c.rail: c for c in inv.hcas}
        rails = tuple(sorted(by_rail))
        home = tuple(home_rails(inv))
        per_rail = Counter(home)
        seen: Counter[int] = Counter()
        rank = []
        for r in home:
            rank.append((seen[r], per_rail[r]))
            seen[r] += 1
        numa = []
        switch = []
        for g in range(len(inv.endpoints)):
            v = inv.gpu_numa[g] if g < len(inv.gpu_numa) else None
            if v is None and home:
                v = by_rail[home[g]].numa_node
            numa.append(v)
            sw = inv.gpu_pcie_switch[g] if g < len(inv.gpu_pcie_switch) else None
            if sw is None and home:
                sw = by_rail[home[g]].pcie_switch
            switch.append(sw)
        sig = tuple(
            (r, by_rail[r].netdev, by_rail[r].numa_node, by_rail[r].pcie_switch) for r in rails
        )
        out.append(
            IndexedHost(
                inv,
                pos,
                rails,
                by_rail,
                home,
                tuple(numa),
                tuple(switch),
                tuple(rank),
                sig,
                frozenset(rails),
                frozenset(home),
            )
        )
    return out


def rail_choices(h: IndexedHost, usable: frozenset[int]) -> tuple[tuple[int, int], ...]:
    """(GPU, rail of the HCA that carries it) for every GPU that has a usable HCA."""
    moved: Counter[int] = Counter()
    out = []
    for g in range(len(h.home)):
        r = h.home[g]
        if r in usable:
            x = r
        else:
            cands = [c for c in h.rails if c in usable]
            if not cands:
                continue
            numa, sw = h.gpu_numa[g], h.gpu_switch[g]
            x = min(
                cands,
                key=lambda c: (
                    sw is None or h.by_rail[c].pcie_switch != sw,
                    numa is None or h.by_rail[c].numa_node != numa,
                    moved[c],
                    c,
                ),
            )
            moved[x] += 1
        out.append((g, x))
    return tuple(out)


@dataclass(slots=True)
class HostBase:
    """The part of H's plan that depends on H alone: rail assignments, prefix routes and the
    backups' changes of both."""

    usable: frozenset[int]
    assignments: tuple[tuple[int, int], ...]  # (GPU, rail)
    prefix_routes: tuple[PrefixRoute, ...]
    # rail -> (changed (GPU, rail) assignments, changed prefix routes) when that rail goes down
    backups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[PrefixRoute, ...]]]


def multipath_rails(usable: frozenset[int], degraded: frozenset[int]) -> frozenset[int]:
    """The rails a multipath prefix route spreads over: the usable ones that are not
    degraded, or all usable ones when that leaves none."""
    return (usable - degraded) or usable


class HostBases:
    """The :class:`HostBase` of each host, shared by hosts with the same rails, NUMA and PCIe
    layout, usable rails and degraded rails (cached; the cache grows with the distinct
    combinations seen). ``subnets``: the fabric's ``endpoint_subnets`` as sorted (home rail,
    prefix) pairs; empty = explicit form (no prefix routes)."""

    def __init__(self, subnets: tuple[tuple[int, IPv4Network], ...]) -> None:
        self._subnets = subnets
        self._prefix_cache: dict[tuple, tuple[PrefixRoute, ...]] = {}
        self._base_cache: dict[tuple, HostBase] = {}

    def prefix_routes(
        self, h: IndexedHost, usable: frozenset[int], degraded: frozenset[int]
    ) -> tuple[PrefixRoute, ...]:
        """One prefix route per rail-major subnet (none in explicit form)."""
        if not self._subnets:
            return ()
        key = (h.sig, usable, degraded)
        out = self._prefix_cache.get(key)
        if out is not None:
            return out
        multi = sorted(multipath_rails(usable, degraded))
        routes = []
        for d, net in self._subnets:
            rails = [d] if d in usable else multi
            routes.append(
                PrefixRoute.model_construct(
                    prefix=net,
                    home_rail=d,
                    rails=list(rails),
                    netdevs=[h.by_rail[r].netdev for r in rails],
                )
            )
        out = tuple(routes)
        self._prefix_cache[key] = out
        return out

    def base(self, h: IndexedHost, u: frozenset[int], degraded: frozenset[int]) -> HostBase:
        """H's base with usable rails ``u``."""
        key = (h.sig, h.home, h.gpu_numa, h.gpu_switch, u, degraded)
        base = self._base_cache.get(key)
        if base is not None:
            return base
        ra = rail_choices(h, u)
        pr = self.prefix_routes(h, u, degraded)
        backups = {}
        before = dict(ra)
        for r in h.rails:
            if r not in u:
                continue
            less = u - {r}
            ra2 = tuple((g, x) for g, x in rail_choices(h, less) if before.get(g) != x)
            pr2 = tuple(
                b for a, b in zip(pr, self.prefix_routes(h, less, degraded), strict=True) if a != b
            )
            backups[r] = (ra2, pr2)
        base = self._base_cache[key] = HostBase(u, ra, pr, backups)
        return base
