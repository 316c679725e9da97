"""The switch side of a discovered fabric: host-leaf links, leaves by scalable unit, spines,
switch-to-switch cables (:func:`fabric_switches`), and the placed-port record the rules of
:mod:`linkguard.topology.discover` share. Pure."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from linkguard.models.discovery import RdmaPortFacts
from linkguard.topology.fabric import Link, Switch
from linkguard.topology.switchgraph import HostCable, SwitchGraph

__all__ = ["Placed", "fabric_switches", "natural", "pci_order", "speed_of", "width_of"]


def natural(name: str) -> tuple[object, ...]:
    """Sort key: ``mlx5_2`` before ``mlx5_10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def pci_order(p: RdmaPortFacts) -> tuple[object, ...]:
    """Sort key of a port: PCI address (ports without one last), then device name, port."""
    return (p.pci_address is None, p.pci_address or "", natural(p.hca), p.port)


@dataclass
class Placed:
    """A host port and its cable: its rail in its host's own numbering, then the leaf's."""

    host: str
    port: RdmaPortFacts
    cable: HostCable
    own_rail: int
    rail: int = -1


def fabric_switches(
    placed: Sequence[Placed],
    leaves: set[str],
    graph: SwitchGraph,
    leaf_rail: Mapping[str, int],
    host_order: Sequence[str],
) -> tuple[list[Link], list[Switch], list[str]]:
    """The host-leaf link of every placed port, the switches (a leaf with its rail and its
    SU: leaves joined by a host they share, numbered in ``host_order``; any other switch with a
    switch cable a spine) and the switch-to-switch cables with their kinds; plus notes."""
    notes: list[str] = []
    # SUs: leaves joined by a host they share, numbered in host order
    su_of: dict[str, int] = {}
    hosts_of: dict[str, list[str]] = defaultdict(list)
    for pl in placed:
        hosts_of[pl.host].append(pl.cable.switch)
    n_su = 0
    for host in host_order:
        group = hosts_of.get(host, [])
        known = {su_of[s] for s in group if s in su_of}
        su = min(known) if known else n_su
        if not known:
            n_su += 1
        for s in group:
            su_of.setdefault(s, su)
    links = [
        Link(
            a=f"{pl.host}:{pl.port.key}",
            b=pl.cable.switch,
            kind="host-leaf",
            rail=pl.rail,
            rate_gbps=pl.cable.rate_gbps or pl.port.rate_gbps,
            a_port=pl.port.port,
            b_port=pl.cable.switch_port,
            width=width_of(pl.cable.width),
            speed=speed_of(pl.cable.speed),
        )
        for pl in placed
    ]
    in_isl = {x for sl in graph.links for x in (sl.a, sl.b)}
    names = sorted(leaves | (in_isl & set(graph.switches)) | leaves, key=natural)
    left = sorted(set(graph.switches) - set(names), key=natural)
    if left:
        notes.append(
            f"{len(left)} switches with neither a placed host port nor a switch cable left "
            f"out: {', '.join(left[:5])}"
        )
    switches = []
    for name in names:
        info = graph.switches.get(name)
        leaf = name in leaves
        switches.append(
            Switch(
                name=name,
                role="leaf" if leaf else "spine",
                rail=leaf_rail[name] if leaf else None,
                su=su_of.get(name) if leaf else None,
                guid=info.guid if info else None,
                description=info.description if info else None,
            )
        )
    for sl in graph.links:
        a, ap, b, bp = sl.a, sl.a_port, sl.b, sl.b_port
        if a not in leaves and b in leaves:
            a, ap, b, bp = b, bp, a, ap
        la, lb = a in leaves, b in leaves
        kind: Literal["leaf-leaf", "leaf-spine", "spine-spine"] = (
            "leaf-leaf" if la and lb else "leaf-spine" if la else "spine-spine"
        )
        same = not lb or leaf_rail.get(b) == leaf_rail.get(a)
        rail = leaf_rail.get(a) if la and same else None
        links.append(
            Link(
                a=a,
                b=b,
                kind=kind,
                rail=rail,
                rate_gbps=sl.rate_gbps,
                a_port=ap,
                b_port=bp,
                width=width_of(sl.width),
                speed=speed_of(sl.speed),
            )
        )
    return links, switches, notes


def width_of(w: str | None) -> Any:
    """The width as :class:`Link` takes it, or None."""
    return w if w in ("1x", "2x", "4x", "8x", "12x") else None


def speed_of(s: str | None) -> Any:
    """The lane speed as :class:`Link` takes it, or None."""
    return s if s in ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR") else None
