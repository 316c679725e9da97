"""Switch-level health: leaves that are down or cut off, uplink capacity left, bisection.

Consumes: a :class:`~linkguard.topology.fabric.Fabric` and the switch-level faults known now:
switches down (names) and switch-to-switch cables down (indices into ``fabric.links``). Host
ports are not this module's business (agents report them). Produces: :class:`Health`, which
says which (host, rail) ports cannot be used because of the switches (their leaf is down, or
cut off from the rest of its rail: every uplink gone), how much leaf uplink capacity is left per
leaf and in total, and the remaining bisection bandwidth. The topology service adds
``Health.unusable`` to the ports its agents report down, so a leaf losing all its uplinks moves
that rail of its whole SU like a leaf failure, and losing some uplinks moves nothing (the rail
still reaches every peer, with less capacity: reported, not rerouted).

Definitions (a rail-optimized Clos, see :mod:`linkguard.topology.generator`):

- a rail's *main part* is the connected component of the working switch graph that holds the
  most of that rail's leaves (ties: the one with more switches, then the first leaf by name); a
  leaf outside it is *cut off*. A single-SU fabric without spines has one leaf per rail: it
  is the main part.
- *bisection* (Gb/s): half the working capacity of the narrowest tier above the leaves
  (leaf-spine, and spine-core where there is a core tier), the bound a Clos cut through its
  middle cannot exceed. Nominal is the same with nothing down.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import networkx as nx

from linkguard.topology.fabric import Fabric

__all__ = ["Health", "LeafUplinks", "SwitchModel", "assess"]


@dataclass(frozen=True)
class LeafUplinks:
    """One leaf: working and nominal uplink capacity (Gb/s); ``cut_off`` as defined above."""

    leaf: str
    rail: int | None
    su: int | None
    up_gbps: float
    nominal_gbps: float
    down: bool
    cut_off: bool


@dataclass(frozen=True)
class Health:
    unusable: dict[str, frozenset[int]]  # host -> rails lost to switch faults
    leaves: list[LeafUplinks]
    bisection_gbps: float
    nominal_bisection_gbps: float
    tiers: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind -> (up, nominal)

    @property
    def bisection_ratio(self) -> float:
        return (
            self.bisection_gbps / self.nominal_bisection_gbps
            if self.nominal_bisection_gbps
            else 1.0
        )

    def summary(self) -> dict[str, object]:
        """A log/API friendly digest: bisection, leaves cut off or down, leaves below full."""
        return {
            "bisection_gbps": self.bisection_gbps,
            "nominal_bisection_gbps": self.nominal_bisection_gbps,
            "leaves_down": [x.leaf for x in self.leaves if x.down],
            "leaves_cut_off": [x.leaf for x in self.leaves if x.cut_off and not x.down],
            "leaves_uplinks_reduced": {
                x.leaf: round(x.up_gbps / x.nominal_gbps, 3)
                for x in self.leaves
                if not x.down and x.nominal_gbps and x.up_gbps < x.nominal_gbps
            },
            "hosts_losing_rails": len(self.unusable),
        }


class SwitchModel:
    """The switch-level view of ``fabric``, prepared once; :meth:`assess` per set of faults."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.names = {s.name: s for s in fabric.switches}
        rail_of_port = {f"{h.host}:{c.key}": (h.host, c.rail) for h in fabric.hosts for c in h.hcas}
        self.host_leaf: dict[str, list[tuple[str, int]]] = defaultdict(list)
        # switch cables grouped by the pair they join: (a, b) -> [(index, kind, rate, leaf)]
        self.pairs: dict[tuple[str, str], list[tuple[int, str, float, str | None]]] = defaultdict(
            list
        )
        for i, link in enumerate(fabric.links):
            if link.kind == "host-leaf":
                port, leaf = (link.a, link.b) if link.a in rail_of_port else (link.b, link.a)
                if port in rail_of_port:
                    self.host_leaf[leaf].append(rail_of_port[port])
                continue
            pair_leaf: str | None = None
            if link.kind == "leaf-spine":
                pair_leaf = link.a if self.names[link.a].role == "leaf" else link.b
            key = (link.a, link.b) if link.a <= link.b else (link.b, link.a)
            self.pairs[key].append((i, link.kind, link.rate_gbps or 0.0, pair_leaf))
        self.by_rail: dict[int, list[str]] = defaultdict(list)
        for name in sorted(self.names):
            sw = self.names[name]
            if sw.role == "leaf" and sw.rail is not None:
                self.by_rail[sw.rail].append(name)

    def assess(
        self, *, switches_down: Iterable[str] = (), links_down: Iterable[int] = ()
    ) -> Health:
        """See :func:`assess`."""
        names = self.names
        dead = set(switches_down)
        for s in dead:
            if s not in names:
                raise ValueError(f"unknown switch {s!r} in fabric {self.fabric.name!r}")
        cut = set(links_down)
        for i in cut:
            if not 0 <= i < len(self.fabric.links):
                raise ValueError(
                    f"link index {i} out of range (fabric has {len(self.fabric.links)})"
                )
        graph: nx.Graph[str] = nx.Graph()
        graph.add_nodes_from(n for n in names if n not in dead)
        up: dict[str, float] = defaultdict(float)
        nominal: dict[str, float] = defaultdict(float)
        tiers_up: dict[str, float] = defaultdict(float)
        tiers_nominal: dict[str, float] = defaultdict(float)
        for (a, b), cables in self.pairs.items():
            ends_up = a not in dead and b not in dead
            any_up = False
            for i, kind, rate, leaf in cables:
                working = ends_up and i not in cut
                any_up |= working
                if leaf is not None:
                    nominal[leaf] += rate
                    up[leaf] += rate if working else 0.0
                if kind in ("leaf-spine", "spine-spine"):
                    tiers_nominal[kind] += rate
                    tiers_up[kind] += rate if working else 0.0
            if any_up:
                graph.add_edge(a, b)
        component = {}
        size = {}
        for k, nodes in enumerate(nx.connected_components(graph)):
            size[k] = len(nodes)
            for n in nodes:
                component[n] = k
        main: dict[int, int | None] = {}
        for rail, leaves in self.by_rail.items():
            counts: dict[int, int] = defaultdict(int)
            first: dict[int, str] = {}
            for leaf in leaves:
                if leaf in component:
                    c = component[leaf]
                    counts[c] += 1
                    first.setdefault(c, leaf)
            main[rail] = (
                min(counts, key=lambda c: (-counts[c], -size[c], first[c])) if counts else None
            )
        leaves_out = []
        unusable: dict[str, set[int]] = defaultdict(set)
        for s in sorted(names):
            sw = names[s]
            if sw.role != "leaf":
                continue
            is_down = s in dead
            off = is_down or (sw.rail is not None and component.get(s) != main.get(sw.rail))
            leaves_out.append(LeafUplinks(s, sw.rail, sw.su, up[s], nominal[s], is_down, off))
            if off:
                for host, rail in self.host_leaf.get(s, ()):
                    unusable[host].add(rail)
        nominal_cut = min(tiers_nominal.values(), default=0.0) / 2
        working_cut = min(tiers_up[k] for k in tiers_nominal) / 2 if tiers_nominal else 0.0
        return Health(
            unusable={h: frozenset(r) for h, r in sorted(unusable.items())},
            leaves=leaves_out,
            bisection_gbps=working_cut,
            nominal_bisection_gbps=nominal_cut,
            tiers={k: (tiers_up[k], tiers_nominal[k]) for k in sorted(tiers_nominal)},
        )


def assess(
    fabric: Fabric,
    *,
    switches_down: Iterable[str] = (),
    links_down: Iterable[int] = (),
) -> Health:
    """Health of ``fabric`` with ``switches_down`` and the cables ``links_down`` (indices into
    ``fabric.links``) out of service. Raises ValueError naming an unknown switch or an index
    out of range. For repeated calls on one fabric keep a :class:`SwitchModel` (the link scan
    is done once; each assessment is then connected components of the switch graph)."""
    return SwitchModel(fabric).assess(switches_down=switches_down, links_down=links_down)
