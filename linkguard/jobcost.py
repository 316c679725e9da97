"""What an outage is to the job model: the outages, their ports and the costs they are priced in.

Consumes: outages as a ledger or a simulated timeline gives them. Produces: :class:`Outage`
records with their ports (:class:`Link`), the :class:`Cost` type a price is given in, the
transports priced (:data:`TRANSPORTS`, titled by :data:`TITLES`), how long a reroute took
(:func:`reroute_s`, :func:`needless`) and each port's fused pair (:func:`fused_rails`,
:func:`generated_fused_rails`). The pricing itself, per transport with and without linkguard,
is :mod:`linkguard.transportcost` (its docstring gives the rules). Pure: no clock, no I/O. It
lives in ``linkguard/`` so the ledger report can use it without importing the simulations.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Literal

from linkguard.failuremodel import FailureModel
from linkguard.models import HostInventory
from linkguard.nccl import PortVerdict, fused_layout, port_verdicts

__all__ = [
    "COMMON_ASSUMES",
    "TITLES",
    "TRANSPORTS",
    "Cost",
    "Link",
    "Outage",
    "Port",
    "Transport",
    "fused_rails",
    "generated_fused_rails",
    "needless",
    "reroute_s",
]

Transport = Literal["ip", "nccl-ib", "nccl-ib-failover"]

#: The transports priced, in the order the reports print them.
TRANSPORTS: tuple[Transport, ...] = ("ip", "nccl-ib", "nccl-ib-failover")

#: What each transport is, as the tables title it.
TITLES: dict[str, str] = {
    "ip": "Gloo, NCCL's socket transport, IPoIB: a reroute moves the job's traffic at once",
    "nccl-ib": "NCCL's IB transport: queue pairs stay on the port they connected on",
    "nccl-ib-failover": "NCCL >= 2.29.7 fused NICs: a queue pair fails over within its pair",
}

#: What every table assumes.
COMMON_ASSUMES = (
    "one synchronous job on every GPU (an outage that stops one rank stops all); a restart "
    "costs its detection + restart_s + half a checkpoint interval; reduced bandwidth while a "
    "rail is out is not charged"
)

#: A port as the pricing tracks it: (host, rail).
Port = tuple[str, int]


@dataclass(frozen=True)
class Link:
    """One port an outage took down: ``host``, ``rail``; ``down_s``: seconds from the
    outage's start until this port was up again; ``out_s``: until linkguard used it again
    (down + hold-down or suppression; None: at ``down_s``)."""

    host: str
    rail: int
    down_s: float
    out_s: float | None = None


@dataclass(frozen=True)
class Outage:
    """One down transition: timeline ``entry`` (or ledger row id) and its ``kind``, ``at_s``
    (s from the window's start), ``down_s`` (longest down episode of the ports it took down,
    clipped at the window's end; ``open``: still down then), ``ports`` taken down,
    ``isolated``: some host had no rail left up (the ledger also sets it for a reroute never
    confirmed: ``ip`` charges both as without linkguard), the time to reroute ``reroute_ms``
    (None: no reroute needed, linkguard already kept traffic off its ports) and the ports
    themselves (``links``; empty: one port, unnamed, down for ``down_s``)."""

    entry: int
    kind: str
    at_s: float
    down_s: float
    ports: int
    open: bool = False
    isolated: bool = False
    reroute_ms: float | None = None
    links: tuple[Link, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        """JSON form, without ``links`` (a leaf reboot has hundreds)."""
        d = asdict(self)
        d.pop("links")
        return d

    def port_links(self) -> tuple[Link, ...]:
        """``links``, or one unnamed port down for ``down_s``."""
        return self.links or (Link(f"?{self.entry}", -1, self.down_s),)


@dataclass(frozen=True)
class Cost:
    """What outages cost the job. ``interruptions``: job restarts; ``stalls``: outages that
    paused it without a restart; ``idle_s``: union of the idle intervals (s, all GPUs idle);
    ``idle_gpu_hours`` = idle_s * GPUs / 3600; ``goodput`` = 1 - idle_s / duration;
    ``interruptions_per_1000_gpu_days``."""

    interruptions: int
    stalls: int
    idle_s: float
    idle_gpu_hours: float
    goodput: float
    interruptions_per_1000_gpu_days: float
    intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("intervals")
        return d


def reroute_s(o: Outage, model: FailureModel) -> float | None:
    """How long traffic took to move off ``o`` (s): its time to reroute, at least the lab's
    data-plane gap ``reroute_floor_s``; None when it needed no reroute."""
    if o.reroute_ms is None:
        return None
    return max(o.reroute_ms / 1000, model.reroute_floor_s)


def needless(o: Outage, model: FailureModel) -> bool:
    """A needless reroute: traffic moved off ``o``'s link only once the link was back (time to
    reroute >= its down time, both on the same clock): it bought nothing and costs a move there
    and back. An outage still open is never needless (its length is not known yet)."""
    r = reroute_s(o, model)
    return r is not None and not o.open and r >= o.down_s


# -- fused pairs ----------------------------------------------------------------------------------
def fused_rails(inventory: HostInventory) -> dict[int, tuple[int, ...]]:
    """rail -> the rails of its fused NIC, as ``linkguard nccl env --profile failover`` groups
    ``inventory``'s ports (:func:`linkguard.nccl.fused_layout`, pairs: PCIe switch, then NUMA
    node, then rail order). ``inventory``: a :class:`~linkguard.models.HostInventory`."""
    layout = fused_layout(port_verdicts(inventory, []))
    return {m.rail: tuple(x.rail for x in g.members) for g in layout.groups for m in g.members}


@functools.lru_cache(maxsize=64)
def generated_fused_rails(rails: int) -> dict[int, tuple[int, ...]]:
    """:func:`fused_rails` of a host laid out as ``linkguard fabric generate`` lays one out
    (rails split over two NUMA nodes in rail order, no PCIe switch ids): 0-1, 2-3, ... when
    each NUMA node has an even number of rails (8 rails: 0-1, 2-3, 4-5, 6-7; 6 rails: 0-1, 3-4,
    2-5). For a ledger, whose fabric is not recorded."""
    verdicts = [
        PortVerdict(
            hca=f"mlx5_{r}",
            port=1,
            rail=r,
            link_layer="InfiniBand",
            numa_node=0 if r < rails / 2 else 1,
            pcie_switch=None,
            pci_address=None,
            usable=True,
            why=None,
            rate_gbps=None,
            expected_gbps=None,
        )
        for r in range(rails)
    ]
    layout = fused_layout(verdicts)
    return {m.rail: tuple(x.rail for x in g.members) for g in layout.groups for m in g.members}
