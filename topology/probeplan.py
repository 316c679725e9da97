"""Which peers each agent probes on each rail (Pingmesh-style bounded fan-out), and what it costs.

Consumes: a :class:`~linkguard.topology.fabric.Fabric`, :class:`ProbeSettings`, a ``seed`` and an
``epoch``. Produces: a :class:`ProbePlan` (per probing port, the ports it probes) and, from
:func:`probe_load`, the fleet's probe packet rate. Pure: no I/O, no clock.

The shape follows Pingmesh (Guo et al., SIGCOMM 2015: every server probes a bounded peer list
computed centrally, inside its ToR and across ToRs) and R-Pingmesh (SIGCOMM 2024: RoCE probes
between RNIC ports of one rail). A probing port is one HCA port of one host, ``(host, rail)``.
Its rail's leaf (``host-leaf`` link in the fabric; without cabling, one group per rail) and the
leaf's scalable unit decide the groups:

- **within the leaf** (``fan_out - cross_su`` peers): the leaf's ports are placed on a ring in a
  seed-determined order; in epoch ``e`` port ``i`` probes ports ``i + o`` for ``k_local``
  consecutive offsets ``o`` starting at ``e * k_local`` (mod ``n - 1``, plus one). A circulant:
  every port is probed by exactly ``k_local`` others in the leaf, and after ``ceil((n - 1) /
  k_local)`` epochs every ordered pair of the leaf has been probed.
- **across SUs** (``cross_su`` peers, same rail, other leaves): slot ``t = e * cross_su + j``
  picks the leaf ``d = 1 + t mod (L - 1)`` places further on the rail's leaf ring and the position
  shifted by ``t // (L - 1)``; with equal leaves every port gets exactly ``cross_su`` cross probers
  and after ``(L - 1) * n_max / cross_su`` epochs every cross pair has been probed.

So a port has ``fan_out`` probers from at least two directions, which is what
:mod:`linkguard.topology.localize` needs to tell a bad port (its many probers fail, they reach
others) from a bad leaf (every port behind it fails from outside).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from linkguard.topology.fabric import Fabric

__all__ = [
    "MAX_PROBES_PER_PORT_PPS",
    "PortId",
    "ProbeLoad",
    "ProbePlan",
    "ProbeSettings",
    "plan_probes",
    "probe_load",
]

#: Upper bound on probes one port sends per second (``fan_out * rate_pps``), enforced by
#: :class:`ProbeSettings`. With in-degree about ``fan_out`` a port then handles at most
#: 4 x 16 = 64 probe packets/s (probes out, replies in, probes in, replies out), and a
#: 16,384-port fleet at most 16,384 x 16 x 2 = 524,288 packets/s in total.
MAX_PROBES_PER_PORT_PPS = 16.0

#: Probe frame on the wire (bytes): Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + probe header 40 +
#: ICRC 4 + FCS 4 (:mod:`linkguard.agent.probe`, RoCE mode; plain UDP is 16 bytes less).
PROBE_FRAME_BYTES = 102


class ProbeSettings(BaseModel):
    """Probe rate and fan-out. Raises ``pydantic.ValidationError`` when ``fan_out * rate_pps``
    exceeds :data:`MAX_PROBES_PER_PORT_PPS` or ``cross_su > fan_out``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fan_out: int = Field(4, ge=1, le=16, description="peers probed per (host, rail)")
    cross_su: int = Field(
        2, ge=0, le=16, description="of fan_out, peers on other leaves of the rail (other SUs)"
    )
    rate_pps: float = Field(1.0, gt=0, le=16, description="probes/s sent to each peer")
    min_probers: int = Field(
        3, ge=1, le=16, description="probers a port needs before a fault can be localised to it"
    )

    @model_validator(mode="after")
    def _bounded(self) -> ProbeSettings:
        if self.cross_su > self.fan_out:
            raise ValueError(f"cross_su {self.cross_su} > fan_out {self.fan_out}")
        per_port = self.fan_out * self.rate_pps
        if per_port > MAX_PROBES_PER_PORT_PPS:
            raise ValueError(
                f"fan_out {self.fan_out} x rate_pps {self.rate_pps} = {per_port:g} probes/s per "
                f"port > {MAX_PROBES_PER_PORT_PPS:g} (keeps 16,384 ports under "
                f"{int(16_384 * MAX_PROBES_PER_PORT_PPS * 2):,} packets/s)"
            )
        return self


@dataclass(frozen=True, order=True)
class PortId:
    """One probing port: a host's HCA port on ``rail``."""

    host: str
    rail: int

    def __str__(self) -> str:
        return f"{self.host}/rail{self.rail}"


@dataclass(frozen=True)
class ProbePlan:
    """``targets[p]``: the ports ``p`` probes this epoch (sorted, no self, no duplicates);
    ``leaf[p]``: its leaf (``"rail<r>"`` when the fabric has no cabling); ``address[p]``: its
    rail address (IPv4 text)."""

    epoch: int
    targets: dict[PortId, tuple[PortId, ...]]
    leaf: dict[PortId, str]
    address: dict[PortId, str]

    def probers(self) -> dict[PortId, list[PortId]]:
        """Per port, the ports that probe it (every port of the plan is a key)."""
        out: dict[PortId, list[PortId]] = {p: [] for p in self.targets}
        for p, ts in self.targets.items():
            for t in ts:
                out[t].append(p)
        return out

    def under_covered(self, m: int) -> list[PortId]:
        """Ports probed by fewer than ``m`` others (groups too small for ``m``)."""
        return sorted(p for p, qs in self.probers().items() if len(qs) < m)


def _order(seed: int, *key: object) -> int:
    h = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def _leaves(fabric: Fabric) -> tuple[dict[PortId, str], dict[str, int], dict[PortId, str]]:
    """Per port its leaf, per leaf its SU (-1 unknown), per port its address."""
    su = {s.name: (s.su if s.su is not None else -1) for s in fabric.switches if s.role == "leaf"}
    cabled: dict[str, str] = {}
    for link in fabric.links:
        if link.kind != "host-leaf":
            continue
        if link.a in su:
            cabled[link.b] = link.a
        elif link.b in su:
            cabled[link.a] = link.b
    leaf: dict[PortId, str] = {}
    addr: dict[PortId, str] = {}
    for h in fabric.hosts:
        for c in h.hcas:
            p = PortId(h.host, c.rail)
            leaf[p] = cabled.get(f"{h.host}:{c.key}", f"rail{c.rail}")
            addr[p] = str(c.address)
            su.setdefault(leaf[p], -1)
    return leaf, su, addr


def plan_probes(
    fabric: Fabric, settings: ProbeSettings | None = None, *, seed: int = 0, epoch: int = 0
) -> ProbePlan:
    """The probe plan of ``epoch`` (module docstring); deterministic in (fabric, settings,
    seed, epoch). Raises ``ValueError`` for a negative epoch."""
    s = settings or ProbeSettings()
    if epoch < 0:
        raise ValueError(f"epoch {epoch} < 0")
    leaf, su, addr = _leaves(fabric)
    by_rail: dict[int, dict[str, list[PortId]]] = defaultdict(lambda: defaultdict(list))
    for p, lf in leaf.items():
        by_rail[p.rail][lf].append(p)
    targets: dict[PortId, set[PortId]] = {p: set() for p in leaf}
    for rail, groups in by_rail.items():
        ring = sorted(groups, key=lambda lf: (su[lf], _order(seed, "leaf", rail, lf), lf))
        for lf in ring:
            groups[lf].sort(key=lambda p: (_order(seed, "port", p.host, p.rail), p))
        n_leaves = len(ring)
        base_cross = min(s.cross_su, s.fan_out) if n_leaves > 1 else 0
        n_max = max(len(groups[x]) for x in ring)
        for li, lf in enumerate(ring):
            ports = groups[lf]
            n = len(ports)
            k_local = min(s.fan_out - base_cross, n - 1)
            # a leaf too small for its in-leaf share probes more across instead
            k_cross = s.fan_out - k_local if n_leaves > 1 else 0
            for i, p in enumerate(ports):
                for j in range(k_local):
                    o = (epoch * k_local + j) % (n - 1) + 1
                    targets[p].add(ports[(i + o) % n])
                for j in range(k_cross):
                    t = epoch * k_cross + j
                    other = groups[ring[(li + 1 + t % (n_leaves - 1)) % n_leaves]]
                    shift = (t // (n_leaves - 1)) % n_max
                    targets[p].add(other[(i + shift) % len(other)])
    return ProbePlan(
        epoch=epoch,
        targets={p: tuple(sorted(ts)) for p, ts in sorted(targets.items())},
        leaf=leaf,
        address=addr,
    )


@dataclass(frozen=True)
class ProbeLoad:
    """Probe traffic of a fleet. ``probes_pps``: probes sent per second fleet-wide;
    ``total_pps``: with replies; ``per_port_pps``: packets one port sends plus receives
    (probes out, replies in, probes in, replies out, in-degree = fan_out); ``total_bps``: bits/s
    on the wire at :data:`PROBE_FRAME_BYTES` per frame."""

    ports: int
    probes_pps: float
    total_pps: float
    per_port_pps: float
    total_bps: float


def probe_load(hosts: int, rails: int, settings: ProbeSettings | None = None) -> ProbeLoad:
    """Packets/s for ``hosts`` x ``rails`` probing ports = hosts x rails x fan_out x rate (x2
    with replies). At the defaults (fan-out 4, 1 probe/s per peer), 2,048 hosts x 8 rails
    (16,384 GPUs at 8 per host) send 65,536 probes/s, 131,072 packets/s with replies, 16
    packets/s per port. Raises ``ValueError`` for negative counts."""
    s = settings or ProbeSettings()
    if hosts < 0 or rails < 0:
        raise ValueError(f"hosts {hosts} and rails {rails} must be >= 0")
    ports = hosts * rails
    probes = ports * s.fan_out * s.rate_pps
    total = 2 * probes
    return ProbeLoad(
        ports=ports,
        probes_pps=probes,
        total_pps=total,
        per_port_pps=4 * s.fan_out * s.rate_pps,
        total_bps=total * PROBE_FRAME_BYTES * 8,
    )


def epochs_to_cover(n_per_leaf: int, leaves: int, settings: ProbeSettings | None = None) -> int:
    """Epochs after which every ordered pair of a rail with ``leaves`` equal leaves of
    ``n_per_leaf`` ports has been probed (the larger of the in-leaf and cross-leaf rotations)."""
    s = settings or ProbeSettings()
    k_cross = min(s.cross_su, s.fan_out) if leaves > 1 else 0
    k_local = min(s.fan_out - k_cross, n_per_leaf - 1)
    local = math.ceil((n_per_leaf - 1) / k_local) if k_local > 0 else 0
    cross = math.ceil((leaves - 1) * n_per_leaf / k_cross) if k_cross > 0 else 0
    return max(local, cross, 1)
