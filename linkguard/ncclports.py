"""Which of a host's ports a job starting now may give NCCL, and how to fuse them: a
:class:`PortVerdict` per port (:func:`port_verdicts`), the ``NCCL_IB_HCA`` value of the usable
ones (:func:`ib_hca`), and the fused-NIC layout for NCCL's port failover (:func:`fused_layout`).
The NCCL facts behind them (versions, syntax, limits) are in :mod:`linkguard.nccl`'s docstring,
which re-exports these names. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from linkguard.models import HostInventory, Plan, PortState, PortStatus

#: First NCCL release with IB/RoCE port failover inside a fused NIC (release notes 2.29.7).
FAILOVER_MIN_VERSION = "2.29.7"
#: First NCCL release that fuses NICs (release notes 2.24.3, "Add NIC fusion").
FUSION_MIN_VERSION = "2.24.3"
#: Most physical devices in one virtual NIC: ``NCCL_NET_MAX_DEVS_PER_NIC`` (net API v9-v11).
MAX_DEVS_PER_VNIC = 4

Why = Literal["down", "held_down", "suppressed", "degraded", "unknown", "not_in_plan"]


@dataclass(frozen=True, slots=True)
class PortVerdict:
    """One HCA port of the host and whether a job starting now should use it.

    ``why`` (None when usable): ``down``, ``held_down`` (back, inside its hold-down),
    ``suppressed`` (damping), ``degraded`` (slower than ``expected_gbps``), ``unknown`` (no
    readable state), ``not_in_plan`` (the applied plan neither assigns a GPU to its rail nor has
    a backup for it: the service does not use the rail at this host). Rates in Gb/s."""

    hca: str
    port: int
    rail: int
    link_layer: str
    numa_node: int | None
    pcie_switch: str | None
    pci_address: str | None
    usable: bool
    why: Why | None
    rate_gbps: float | None
    expected_gbps: float | None

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"

    @property
    def nccl_name(self) -> str:
        """The port as NCCL lists it: ``mlx5_3:1``."""
        return f"{self.hca}:{self.port}"


def port_verdicts(
    inventory: HostInventory,
    states: Iterable[PortState],
    plan: Plan | None = None,
    *,
    expected_gbps: Mapping[str, float] | float | None = None,
    degraded: Collection[str] = (),
) -> list[PortVerdict]:
    """A :class:`PortVerdict` for every port of ``inventory``, in rail order.

    ``states``: the latest state of each port (other hosts' states raise ValueError; a port
    without one is ``unknown``). ``plan``: the applied plan; its rails (GPU assignments and
    backups) bound what is usable, None = no such bound. ``expected_gbps``: the rate each port
    should run at, one number for all or by ``"hca/port"``; missing = the highest rate among the
    host's up ports of the same link layer. ``degraded``: ``"hca/port"`` keys someone else
    judged degraded (the service's API view).
    """
    by_key: dict[str, PortState] = {}
    for st in states:
        if st.host != inventory.host:
            raise ValueError(f"state of {st.host}:{st.key} given for host {inventory.host}")
        by_key[st.key] = st
    best: dict[str, float] = {}
    for h in inventory.hcas:
        up = by_key.get(h.key)
        if up is not None and up.status == PortStatus.UP and up.rate_gbps:
            layer = h.link_layer.value
            best[layer] = max(best.get(layer, 0.0), up.rate_gbps)
    in_plan: set[int] | None = None
    if plan is not None:
        if plan.host != inventory.host:
            raise ValueError(f"plan of {plan.host} given for host {inventory.host}")
        in_plan = {a.rail for a in plan.rail_assignments} | {b.rail for b in plan.backups}
    out = []
    for h in sorted(inventory.hcas, key=lambda h: h.rail):
        hst = by_key.get(h.key)
        expected = expected_gbps.get(h.key) if isinstance(expected_gbps, Mapping) else expected_gbps
        if expected is None:
            expected = best.get(h.link_layer.value)
        why: Why | None = _why(hst)
        rate = hst.rate_gbps if hst is not None else None
        if why is None and (
            h.key in degraded or (expected is not None and rate is not None and rate < expected)
        ):
            why = "degraded"
        if why is None and in_plan is not None and h.rail not in in_plan:
            why = "not_in_plan"
        out.append(
            PortVerdict(
                hca=h.hca,
                port=h.port,
                rail=h.rail,
                link_layer=h.link_layer.value,
                numa_node=h.numa_node,
                pcie_switch=getattr(h, "pcie_switch", None),
                pci_address=h.pci_address,
                usable=why is None,
                why=why,
                rate_gbps=rate,
                expected_gbps=expected,
            )
        )
    return out


def _why(st: PortState | None) -> Why | None:
    if st is None or st.status == PortStatus.UNKNOWN:
        return "unknown"
    if st.status == PortStatus.DOWN:
        return "down"
    if st.status == PortStatus.HELD_DOWN:
        return "held_down"
    if st.status == PortStatus.SUPPRESSED or st.damping.suppressed:
        return "suppressed"
    if st.status == PortStatus.DEGRADED:  # counter health or re-admission (agent monitor)
        return "degraded"
    if not st.usable:
        return "down"
    return None


def ib_hca(verdicts: Sequence[PortVerdict]) -> str | None:
    """``NCCL_IB_HCA`` for the usable ports, in rail order, exact names with ports:
    ``=mlx5_0:1,mlx5_3:1``. None when no port is usable (an empty value would select every
    device: write ``NCCL_IB_DISABLE=1`` instead)."""
    names = [v.nccl_name for v in sorted(verdicts, key=lambda v: v.rail) if v.usable]
    return "=" + ",".join(names) if names else None


@dataclass(frozen=True, slots=True)
class FusedNic:
    """One virtual NIC of the layout: its members in rail order, and what grouped them
    (``pcie_switch``, ``numa``, or ``rail_order`` when neither was known or shared).

    ``state``: ``intact`` (all members usable: one loss is survivable), ``lost_one`` (one
    member gone: no margin left, a second loss would be fatal to a job that fused them, so it is
    not fused for jobs starting now), ``broken`` (two or more gone), ``single`` (one member:
    nothing to fail over to)."""

    members: tuple[PortVerdict, ...]
    basis: Literal["pcie_switch", "numa", "rail_order"]

    @property
    def name(self) -> str:
        """NCCL's name of the fused device: the members' names joined by ``+``."""
        return "+".join(m.hca for m in self.members)

    @property
    def lost(self) -> tuple[PortVerdict, ...]:
        return tuple(m for m in self.members if not m.usable)

    @property
    def state(self) -> Literal["intact", "lost_one", "broken", "single"]:
        if len(self.members) == 1:
            return "single"
        n = len(self.lost)
        return "intact" if n == 0 else "lost_one" if n == 1 else "broken"

    @property
    def force_merge(self) -> str:
        """This group as one ``NCCL_NET_FORCE_MERGE`` entry: ``mlx5_0:1,mlx5_1:1``."""
        return ",".join(m.nccl_name for m in self.members)


@dataclass(frozen=True, slots=True)
class FusedLayout:
    """Rails grouped into fused virtual NICs, computed from the inventory (every port, usable
    or not) so every host with the same hardware gets the same groups. :meth:`env` is what a
    job starting now sets; :meth:`tradeoff` states the bandwidth cost; ``warnings`` names the
    groups that already lost a port."""

    groups: tuple[FusedNic, ...]
    size: int

    @property
    def warnings(self) -> list[str]:
        out = []
        for g in self.groups:
            lost = ", ".join(f"{m.nccl_name} ({m.why})" for m in g.lost)
            if g.state == "lost_one":
                out.append(
                    f"fused NIC {g.name} lost {lost}: a job fusing it would not survive a "
                    "second loss in it (NCCL fails the communicator when more than one device "
                    "of a fused NIC has failed); jobs starting now get the survivor unfused"
                )
            elif g.state == "broken":
                out.append(f"fused NIC {g.name} lost {lost}: the survivors are left unfused")
            elif g.state == "single":
                m = g.members[0]
                out.append(f"{m.nccl_name} (rail {m.rail}) is alone in its group: no port failover")
        return out

    def env(self, verdicts: Sequence[PortVerdict]) -> dict[str, str]:
        """The settings for jobs starting now (NCCL >= :data:`FAILOVER_MIN_VERSION`): the usable
        ports, only the intact groups fused (a group that lost a port cannot be fused: NCCL sees
        only ACTIVE ports and would not find the member), no automatic merging beyond them
        (``NCCL_NET_MERGE_LEVEL=LOC``), and port failover on."""
        hca = ib_hca(verdicts)
        if hca is None:
            return {"NCCL_IB_DISABLE": "1"}
        env = {"NCCL_IB_HCA": hca}
        merged = [g.force_merge for g in self.groups if g.state == "intact"]
        if merged:
            env |= {
                "NCCL_IB_MERGE_NICS": "1",
                "NCCL_NET_MERGE_LEVEL": "LOC",
                "NCCL_NET_FORCE_MERGE": ";".join(merged),
                "NCCL_IB_RESILIENCY_PORT_FAILOVER": "1",
            }
        return env

    def tradeoff(self) -> str:
        """The bandwidth trade-off of this layout, with its numbers."""
        ports = [m for g in self.groups for m in g.members]
        n, k, g = len(ports), self.size, len(self.groups)
        rate = max((m.expected_gbps or m.rate_gbps or 0.0 for m in ports), default=0.0)
        per = f"{rate:g} Gb/s" if rate else "its rate"
        fused = f"{k * rate:g} Gb/s" if rate else f"{k}x"
        kept = f"{(k - 1) * rate:g} Gb/s" if rate else f"{k - 1}/{k}"
        return (
            f"{n} ports of {per} become {g} fused NICs of up to {k} ({fused} each): NCCL sees "
            f"{g} devices instead of {n}. A port lost inside a fused NIC leaves that NIC "
            f"{kept} ({(k - 1) / k:.0%}) and the host {n - 1}/{n} of its bandwidth, and the job "
            "keeps running after the retry budget (NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT, ~30 s "
            "at 20 and 7) instead of failing its communicator. The cost: fewer, fatter devices "
            "(a GPU's traffic is spread over every member's rail and leaf, not kept on its "
            "nearest NIC; NCCL splits each connection's queue pairs over the members), and a "
            "group with one port lost has no margin: a second loss in it is fatal."
        )


def fused_layout(
    verdicts: Sequence[PortVerdict],
    *,
    size: int = 2,
    switch_of: Mapping[str, str] | None = None,
) -> FusedLayout:
    """Group the ports of ``verdicts`` into fused NICs of ``size`` (2 to
    :data:`MAX_DEVS_PER_VNIC`): ports on one PCIe switch first (``switch_of`` by ``"hca/port"``,
    else the inventory's ``pcie_switch``), then on one NUMA node, then what is left in rail
    order; never two link layers in one group (NCCL refuses to fuse them). A port left over
    alone is a ``single`` group. ValueError for a size outside 2..4."""
    if not 2 <= size <= MAX_DEVS_PER_VNIC:
        raise ValueError(f"fused NIC size {size}: must be 2 to {MAX_DEVS_PER_VNIC}")
    ports = sorted(verdicts, key=lambda v: v.rail)
    switches = dict(switch_of or {})
    groups: list[FusedNic] = []
    left = ports

    def chunk(
        pool: list[PortVerdict], key: Any, basis: Literal["pcie_switch", "numa", "rail_order"]
    ) -> list[PortVerdict]:
        buckets: dict[Any, list[PortVerdict]] = {}
        for v in pool:
            buckets.setdefault(key(v), []).append(v)
        rest: list[PortVerdict] = []
        for k_, members in buckets.items():
            if k_ is None or k_[1] is None:
                rest.extend(members)
                continue
            full = len(members) - len(members) % size
            for i in range(0, full, size):
                groups.append(FusedNic(tuple(members[i : i + size]), basis))
            rest.extend(members[full:])
        return sorted(rest, key=lambda v: v.rail)

    left = chunk(left, lambda v: (v.link_layer, switches.get(v.key, v.pcie_switch)), "pcie_switch")
    left = chunk(left, lambda v: (v.link_layer, v.numa_node), "numa")
    by_layer: dict[str, list[PortVerdict]] = {}
    for v in left:
        by_layer.setdefault(v.link_layer, []).append(v)
    for members in by_layer.values():
        for i in range(0, len(members), size):
            groups.append(FusedNic(tuple(members[i : i + size]), "rail_order"))
    groups.sort(key=lambda g: g.members[0].rail)
    return FusedLayout(tuple(groups), size)
