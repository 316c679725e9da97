"""The bus contract: every message linkguard sends or receives, as pydantic v2 models.

Each model is validated on every decode (:func:`decode`). Payloads are JSON. Units are in the
field names or descriptions: ``rate_gbps`` is Gb/s as in the sysfs ``rate`` file
(Documentation/ABI/stable/sysfs-class-infiniband), times are seconds.

Port state names and numbers follow the InfiniBand Architecture Specification vol. 1, 14.2.5.6
(PortInfo.PortState and PortInfo.PortPhysicalState), which is what the kernel prints in
``/sys/class/infiniband/<hca>/ports/<n>/state`` (``4: ACTIVE``) and ``phys_state`` (``5: LinkUp``).
"""

from __future__ import annotations

import ipaddress
import re
import types
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "LANE_GBPS",
    "LINK_WIDTHS",
    "MAX_MESSAGE_BYTES",
    "MAX_PORT_RATE_GBPS",
    "PORT_RATES_GBPS",
    "Ack",
    "AckResult",
    "Backup",
    "BadMessage",
    "CableRef",
    "CoreTier",
    "DampingStatus",
    "FabricFaults",
    "HCAInfo",
    "HostInventory",
    "HostStatus",
    "LinkLayer",
    "ManagementHostsPerSU",
    "PeerClass",
    "PeerRoutes",
    "PhysState",
    "Plan",
    "PortEvent",
    "PortRef",
    "PortState",
    "PortStateName",
    "PortStatus",
    "PrefixRoute",
    "ProbePair",
    "ProbePeer",
    "ProbeRail",
    "ProbeReport",
    "ProbeTargets",
    "RailAssignment",
    "RouteAssignment",
    "ServiceStatus",
    "SettingsModel",
    "SharedRoutes",
    "SpinesPerSU",
    "decode",
    "encode",
    "expand_plan",
    "port_rate_problem",
]

#: Default upper bound on one bus payload (bytes). A full plan for a 32-host SU with 8 GPUs per
#: host is ~60 KiB; 4 MiB leaves room for issue-3 sized plans while refusing floods.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: Per-lane rate in Gb/s as the kernel prints it in sysfs ``ports/<n>/rate`` ("40 Gb/sec (4X
#: QDR)"; drivers/infiniband/core/sysfs.c ``rate_show``, deci-Gb/s 25/50/100/100/140/250/500/
#: 1000/2000). ``Link.rate_gbps`` = lanes x this, the same unit as ``PortState.rate_gbps`` and the
#: generator's ``NDR_GBPS`` (400 for 4x NDR), so imported, generated and observed rates compare.
LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}

#: Generator parameters as config and scenario schemas take them (one definition of the bounds;
#: the defaults are :func:`~linkguard.topology.generator.generate_rail_optimized`'s: 0, 4,
#: None).
ManagementHostsPerSU = Annotated[
    int, Field(ge=0, le=1023, description="host slots per SU left empty (management nodes)")
]
SpinesPerSU = Annotated[
    int, Field(ge=0, le=64, description="spines per SU (0: one leaf per rail, one SU only)")
]
CoreTier = Annotated[
    bool | None,
    Field(
        description="a core tier above the spines (default: when SUs x spines_per_su exceeds "
        "a leaf's uplinks, and always from 16 SUs)"
    ),
]


#: Link widths (lanes) a port runs at, as sysfs ``rate`` prints them ("(4X NDR)"; IBTA Vol. 1
#: PortInfo LinkWidthActive: 1x, 2x, 4x, 8x, 12x).
LINK_WIDTHS: tuple[int, ...] = (1, 2, 4, 8, 12)
#: Every rate (Gb/s) a port reports: a width times a lane rate (2.5 ... 2400).
PORT_RATES_GBPS: frozenset[float] = frozenset(
    w * g for w in LINK_WIDTHS for g in LANE_GBPS.values()
)
#: The fastest port rate there is: 12X XDR, 2400 Gb/s.
MAX_PORT_RATE_GBPS: float = max(LINK_WIDTHS) * LANE_GBPS["XDR"]


def port_rate_problem(rate: float) -> str | None:
    """Why ``rate`` (Gb/s) is no rate a port reports, else None: one above 12X XDR
    (:data:`MAX_PORT_RATE_GBPS`), or one that is no width x lane rate
    (:data:`PORT_RATES_GBPS`; the two nearest are named). A port held to such a rate (a
    configured ``expected_rate_gbps``, a hand-edited learnt one) would stay degraded for good."""
    if rate in PORT_RATES_GBPS:
        return None
    if rate > MAX_PORT_RATE_GBPS:
        return f"{rate:g} Gb/s is above any port's rate ({MAX_PORT_RATE_GBPS:g} Gb/s, 12X XDR)"
    near = sorted(PORT_RATES_GBPS, key=lambda r: (abs(r - rate), r))[:2]
    return (
        f"{rate:g} Gb/s is no rate a port reports (a width 1X/2X/4X/8X/12X times a lane rate "
        f"SDR 2.5 ... XDR 200 Gb/s); nearest: {' or '.join(f'{r:g}' for r in near)}"
    )


HostName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
]
HCAName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
NetdevName = Annotated[str, Field(min_length=1, max_length=15, pattern=r"^[A-Za-z0-9_.\-@:]+$")]
#: A PCIe switch id: the bus id of its upstream port (``0000:01:00.0``, from sysfs or an NCCL
#: topology file) or any label (``pcie0``); devices with equal ids share the switch.
PCIeSwitchId = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
]
PortNum = Annotated[int, Field(ge=1, le=255, description="1-based port number, as in sysfs")]
RailIndex = Annotated[int, Field(ge=0, le=63)]
#: A switch name, as ``Switch.name`` in :mod:`linkguard.topology.fabric`.
SwitchName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
]
Epoch = Annotated[int, Field(ge=0, le=2**63 - 1)]


class _Model(BaseModel):
    # allow_inf_nan=False: JSON has no NaN/Infinity (RFC 8259); pydantic would accept them (and
    # 1e999 as inf), and encode() writes them as null, which no longer decodes
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _number_kind(annotation: Any) -> type | None:
    """int or float for a field typed ``int``/``float`` (optionally ``| None``), else None."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    kinds = {a for a in (args or (annotation,)) if a is not type(None)}
    return kinds.pop() if len(kinds) == 1 and kinds <= {int, float} else None


#: Text that is a number with a point or an exponent ("4.0", "4e0"): an environment variable
#: for a whole-number field that pydantic's lax mode would take as 4.
_FRACTIONAL = re.compile(r"\s*[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)\s*")


class SettingsModel(BaseModel):
    """Base of the settings sections: a number field takes numbers only. pydantic's lax mode
    reads YAML ``true`` as 1 and ``4.0`` as the whole number 4; here ``true``/``false`` in a
    number field and any float in a whole-number field raise ValueError (``must be a number,
    not true``; ``must be a whole number, not 4.0``). The environment's text (``"4"``) is
    still parsed as before, but ``"4.0"`` in a whole-number field is refused as in YAML. A
    section with an ``enabled`` switch given as a bare ``true``/``false`` is refused with the
    form to write (``{enabled: false}``)."""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_only(cls, v: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        section = field.annotation if field is not None else None
        if (
            isinstance(v, bool)
            and isinstance(section, type)
            and issubclass(section, BaseModel)
            and "enabled" in section.model_fields
        ):  # ``counter_health: false``: a section with an on/off switch
            word = str(v).lower()
            raise ValueError(f"a section, not a switch: write {{enabled: {word}}}, not {word}")
        kind = _number_kind(section)
        if kind is None:
            return v
        if isinstance(v, bool):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        if kind is int and isinstance(v, float):
            raise ValueError(f"must be a whole number, not {v!r}")
        if kind is int and isinstance(v, str) and _FRACTIONAL.fullmatch(v):
            raise ValueError(f"must be a whole number, not {v.strip()!r}")
        return v


class PortStateName(StrEnum):
    """Logical port state (IBA 14.2.5.6, PortInfo.PortState; sysfs ``state``)."""

    NOP = "NOP"  # 0: no state change / unknown
    DOWN = "DOWN"  # 1
    INIT = "INIT"  # 2
    ARMED = "ARMED"  # 3
    ACTIVE = "ACTIVE"  # 4
    ACTIVE_DEFER = "ACTIVE_DEFER"  # 5


class PhysState(StrEnum):
    """Physical port state (IBA 14.2.5.6, PortInfo.PortPhysicalState; sysfs ``phys_state``)."""

    SLEEP = "Sleep"  # 1
    POLLING = "Polling"  # 2
    DISABLED = "Disabled"  # 3
    PORT_CONFIGURATION_TRAINING = "PortConfigurationTraining"  # 4
    LINK_UP = "LinkUp"  # 5
    LINK_ERROR_RECOVERY = "LinkErrorRecovery"  # 6
    PHY_TEST = "PhyTest"  # 7


class LinkLayer(StrEnum):
    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"


class PortStatus(StrEnum):
    """Effective status after debounce and damping, what the solver acts on."""

    UP = "up"  # usable
    DOWN = "down"  # not usable right now
    HELD_DOWN = "held_down"  # back up, but inside its hold-down
    SUPPRESSED = "suppressed"  # back up, but its damping penalty is above the reuse threshold
    #: up but drained (``reason`` says why): its error counters crossed a threshold
    #: (linkguard.agent.health) or it came back slower / changed (re-admission check)
    DEGRADED = "degraded"
    UNKNOWN = "unknown"  # never observed with a readable state


class DampingStatus(_Model):
    """Flap history of one port. Times are host monotonic seconds converted to wall time."""

    flaps: int = Field(0, ge=0, description="flaps inside the current history window")
    penalty: float = Field(0.0, ge=0, description="RFC 2439-style figure of merit")
    suppressed: bool = False
    hold_down_s: float = Field(0.0, ge=0, description="current hold-down length (s)")
    hold_down_remaining_s: float = Field(0.0, ge=0, description="time left before reuse (s)")


class PortRef(_Model):
    """A port of an HCA on a host."""

    host: HostName
    hca: HCAName
    port: PortNum

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


class HCAInfo(_Model):
    """One compute HCA/NIC port of a host inventory."""

    hca: HCAName
    port: PortNum = 1
    rail: RailIndex
    link_layer: LinkLayer = LinkLayer.INFINIBAND
    netdev: NetdevName | None = None
    pci_address: str | None = Field(None, max_length=32, description="PCI BDF, 0000:18:00.0")
    numa_node: int | None = Field(None, ge=-1, le=1023)
    pcie_switch: PCIeSwitchId | None = Field(
        None,
        description="the PCIe switch this HCA hangs on (linkguard.layout): the solver prefers "
        "an HCA on the GPU's switch, then on its NUMA node",
    )
    address: ipaddress.IPv4Address | None = Field(
        None, description="this port's IPv4 address on its rail subnet (the next hop peers use)"
    )

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


class HostInventory(_Model):
    """What one host has: its compute HCAs (one per rail) and its GPUs' endpoints."""

    host: HostName
    hcas: list[HCAInfo] = Field(max_length=64)
    endpoints: list[ipaddress.IPv4Address] = Field(
        default_factory=list, max_length=64, description="one /32 per GPU, index = GPU"
    )
    gpu_numa: list[int | None] = Field(default_factory=list, max_length=64)
    gpu_pcie_switch: list[PCIeSwitchId | None] = Field(
        default_factory=list,
        max_length=64,
        description="per GPU (index = GPU) the PCIe switch it hangs on, or empty",
    )

    @model_validator(mode="after")
    def _rails_unique(self) -> HostInventory:
        rails = [h.rail for h in self.hcas]
        if len(set(rails)) != len(rails):
            raise ValueError(f"host {self.host}: two HCAs on the same rail: {sorted(rails)}")
        keys = [h.key for h in self.hcas]
        if len(set(keys)) != len(keys):
            raise ValueError(f"host {self.host}: duplicate HCA port")
        return self


class PortState(_Model):
    """The monitored state of one port, published retained on ``hosts/<host>/ports/<hca>/<port>``.

    ``state``/``phys_state`` are None when unreadable (bad sysfs value): "unknown", which never
    turns into a route change. ``usable`` is the effective verdict after hold-down and damping.
    """

    host: HostName
    hca: HCAName
    port: PortNum
    rail: RailIndex | None = None
    link_layer: LinkLayer | None = None
    netdev: NetdevName | None = None
    state: PortStateName | None = None
    phys_state: PhysState | None = None
    carrier: bool | None = Field(None, description="netdev IFF_LOWER_UP (RoCE/IPoIB)")
    rate_gbps: float | None = Field(None, ge=0, le=100_000)
    status: PortStatus = PortStatus.UNKNOWN
    usable: bool = False
    reason: str | None = Field(None, max_length=200, description="why not usable, e.g. no_sm")
    damping: DampingStatus = DampingStatus()
    counters: dict[str, int | None] = Field(default_factory=dict, max_length=256)
    counters_saturated: list[str] = Field(default_factory=list, max_length=256)
    gid_index_changed: bool = Field(
        False,
        description="RoCE: the GID table's indexes moved when the port last came back from "
        "hold-down (a GID now at another index; NCCL_IB_GID_INDEX may need a new value)",
    )
    observed_at: float = Field(ge=0, description="wall-clock seconds since the Unix epoch")
    seq: int = Field(0, ge=0, description="per-agent sequence number, increases per publish")

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


class PortEvent(_Model):
    """One status transition of a port (not retained; the ledger records these)."""

    host: HostName
    hca: HCAName
    port: PortNum
    rail: RailIndex | None = None
    previous: PortStatus
    current: PortStatus
    reason: str | None = Field(None, max_length=200)
    at: float = Field(ge=0, description="wall-clock seconds since the Unix epoch")


class HostStatus(_Model):
    """Retained on ``hosts/<host>/status``; the broker publishes ``online=False`` as last will.

    ``instance`` (random per process) and ``started_at`` tell two processes that claim the same
    host apart (cloned machines with one host name): see :mod:`linkguard.presence`.

    ``reason`` of an offline status: ``stopped`` (the agent stopped cleanly: routes are left as
    its shutdown policy says) or ``lost`` (its last will: the broker lost the connection, the
    host or its agent may be dead); the service routes around a ``lost`` host after a grace
    period (:class:`~linkguard.config.OfflineSettings`). None (an older agent): neither.
    """

    host: HostName
    online: bool
    reason: Literal["stopped", "lost"] | None = None
    at: float | None = None
    version: str | None = Field(None, max_length=64)
    instance: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]+$")
    started_at: float | None = Field(None, ge=0)


class ServiceStatus(_Model):
    """Retained on ``service/status`` by the topology service (last will: ``online=False``).
    ``role``/``term``: with leader election (:mod:`linkguard.topology.leader`) only the leader
    announces itself (role ``leader`` and its term); None: no election (or an older service)."""

    online: bool
    at: float | None = None
    version: str | None = Field(None, max_length=64)
    instance: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]+$")
    started_at: float | None = Field(None, ge=0)
    role: Literal["leader", "standby"] | None = None
    term: Epoch | None = None


class CableRef(_Model):
    """Switch-to-switch cables between switches ``a`` and ``b`` (either order; any cable kind
    but ``host-leaf``). ``count``: how many of the parallel cables there are down, taken in the
    fabric's link order; None = all of them."""

    a: SwitchName
    b: SwitchName
    count: int | None = Field(
        None, ge=1, le=255, description="cables down between a and b; None = all of them"
    )

    @model_validator(mode="after")
    def _two_switches(self) -> CableRef:
        if self.a == self.b:
            raise ValueError(f"a cable joins two switches, not {self.a!r} to itself")
        return self

    @property
    def pair(self) -> tuple[str, str]:
        """``(a, b)`` in name order: the same pair whichever end is named first."""
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)


class FabricFaults(_Model):
    """The complete set of switch-level faults known now, retained on ``fabric/faults`` by an
    operator or a monitor (``linkguard fabric faults``); each message replaces the previous
    one (empty lists: nothing down). ``switches_down``: switch names, each once;
    ``cables_down``: cables between two switches (a pair may be listed once); a repeat is a
    validation error. Names are checked against the fabric by the topology service, which
    refuses the whole set when one is unknown (and puts the last set it accepted back on the
    topic). Bounds: 4,096 switches, 32,768 pairs (a generated 2,048-host x 8-rail fabric has
    1,024 switches and 18,432 cabled switch pairs)."""

    switches_down: list[SwitchName] = Field(default_factory=list, max_length=4096)
    cables_down: list[CableRef] = Field(default_factory=list, max_length=32768)
    reason: str | None = Field(None, max_length=200, description="why, e.g. a ticket number")
    at: float = Field(ge=0, description="wall-clock seconds since the Unix epoch")

    @model_validator(mode="after")
    def _each_once(self) -> FabricFaults:
        names: set[str] = set()
        for s in self.switches_down:
            if s in names:
                raise ValueError(f"switch {s} listed twice")
            names.add(s)
        seen: set[tuple[str, str]] = set()
        for c in self.cables_down:
            if c.pair in seen:
                raise ValueError(f"cables between {c.a} and {c.b} listed twice")
            seen.add(c.pair)
        return self


class RailAssignment(_Model):
    """Which HCA port carries the traffic of one local GPU."""

    gpu: int = Field(ge=0, le=63)
    endpoint: ipaddress.IPv4Address
    hca: HCAName
    port: PortNum
    rail: RailIndex
    home_rail: RailIndex


class RouteAssignment(_Model):
    """How this host reaches one peer endpoint: a /32 via the peer's address on one rail."""

    destination: ipaddress.IPv4Address
    peer: HostName
    peer_gpu: int = Field(ge=0, le=63)
    rail: RailIndex
    home_rail: RailIndex
    netdev: NetdevName | None = Field(None, description="local egress netdev on that rail")
    gateway: ipaddress.IPv4Address


class PrefixRoute(_Model):
    """The route to every peer endpoint homed on one rail: that rail's endpoint subnet
    (``Fabric.endpoint_subnets``), on-link out of one local netdev, or several (a multipath
    route: the kernel hashes flows over equal-weight nexthops) when the home rail is not usable
    here. No gateway: the peer that owns a destination answers ARP for it on whichever rail the
    packet arrives. ``rails`` empty means no local rail is usable: an ``unreachable`` route.
    /32 :class:`RouteAssignment` exceptions of the same plan win over this route (longest
    prefix)."""

    prefix: ipaddress.IPv4Network
    home_rail: RailIndex
    rails: list[RailIndex] = Field(default_factory=list, max_length=64)
    netdevs: list[NetdevName | None] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _pairs(self) -> PrefixRoute:
        if len(self.rails) != len(self.netdevs):
            raise ValueError(f"{len(self.rails)} rails but {len(self.netdevs)} netdevs")
        if len(set(self.rails)) != len(self.rails):
            raise ValueError(f"rail listed twice: {self.rails}")
        return self


def _unique_prefixes(routes: list[PrefixRoute]) -> None:
    prefixes = [r.prefix for r in routes]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError("a prefix is routed twice")


class Backup(_Model):
    """Precomputed fast-path change for one local port: what this host switches to on its own
    the moment that port goes down, before the service answers. Only the entries that differ
    from the plan are listed (``prefix_routes`` replace the plan's route for the same prefix,
    ``routes`` add or replace /32 exceptions); ``withdraw`` are destinations with no surviving
    path (no route, or an ``unreachable`` /32 where a prefix route would cover them)."""

    hca: HCAName
    port: PortNum
    rail: RailIndex
    rail_assignments: list[RailAssignment] = Field(default_factory=list, max_length=64)
    prefix_routes: list[PrefixRoute] = Field(default_factory=list, max_length=64)
    routes: list[RouteAssignment] = Field(default_factory=list, max_length=200_000)
    withdraw: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=200_000)


class SharedRoutes(_Model):
    """Marks a compact plan: the host takes its /32 routes to impaired peers (and its backups'
    changes of them) from the retained ``peers/<peer>`` messages (:class:`PeerRoutes`) instead
    of from the plan; :func:`expand_plan` combines the two. ``position``: this host's index in
    the fabric's host order; ``hosts``: how many hosts the fabric has; ``netdevs``: this host's
    egress netdev per rail."""

    position: int = Field(ge=0, le=1_000_000)
    hosts: int = Field(ge=1, le=1_000_001)
    netdevs: dict[RailIndex, NetdevName] = Field(max_length=64)

    @model_validator(mode="after")
    def _inside(self) -> SharedRoutes:
        if self.position >= self.hosts:
            raise ValueError(f"position {self.position} outside a fabric of {self.hosts} hosts")
        return self


#: An IPv4 address in dotted-quad text, checked by a pattern (no leading zeros): peer routes
#: reach every host, and parsing 16 ``IPv4Address`` fields was half of decoding one; the few a
#: host uses become ``IPv4Address`` in :func:`expand_plan`.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPv4Text = Annotated[str, Field(pattern=rf"^{_OCTET}(\.{_OCTET}){{3}}$", max_length=15)]

#: A GPU or rail number in :class:`PeerClass`'s flat lists; -1 for "no rail" (unreachable).
_Small = Annotated[int, Field(ge=-1, le=63)]


class PeerClass(_Model):
    """What one class of viewing hosts adds for one impaired peer, as flat integer lists (a
    peer message holds up to 56 classes and every host decodes it: flat lists decode about 5x
    faster than nested pairs). ``routes``: pairs ``g, x``: a /32 for the peer's GPU g via rail
    x (the viewer's prefix routes would not deliver it), x = -1: ``unreachable``.
    ``backups``: triples ``r, g, x``: when local rail r goes down at the viewer (its fast
    path), GPU g's /32 moves to rail x (-1: withdrawn). Their structure (lengths, GPU and rail
    numbers) is checked when a viewer uses the class (:func:`expand_plan`)."""

    routes: list[_Small] = Field(default_factory=list, max_length=128)
    backups: list[_Small] = Field(default_factory=list, max_length=64 * 64 * 3)


class PeerRoutes(_Model):
    """Routes every whole host needs towards one impaired peer, retained on ``peers/<host>``
    (one message per impaired host, so a host link event is one broker fan-out instead of a
    new plan for every host). Epochs come from the plans' counter.

    A viewer with a compact plan (:class:`SharedRoutes`) uses ``classes[c]`` with
    ``c = ((viewer.position - position - 1) mod hosts) mod modulus``: the solver spreads the
    routes one failed rail displaces round-robin over the survivors by that circular offset
    (:mod:`linkguard.topology.solver`), so viewers of one residue class need the same routes.
    ``classes`` empty: the peer is whole again (nothing to add). ``endpoints``/``home_rails``:
    per peer GPU; ``addresses``: the peer's address per rail (the /32s' gateways)."""

    host: HostName
    epoch: Epoch
    term: Epoch = Field(
        0,
        description="the leader term of the service that issued it (0: no election); agents "
        "refuse a lower term than the highest they have seen and order by (term, epoch)",
    )
    issued_at: float = Field(ge=0)
    position: int = Field(ge=0, le=1_000_000)
    modulus: int = Field(ge=1, le=4096)
    endpoints: list[IPv4Text] = Field(max_length=64)
    home_rails: list[RailIndex] = Field(max_length=64)
    addresses: dict[RailIndex, IPv4Text] = Field(max_length=64)
    classes: list[PeerClass] = Field(default_factory=list, max_length=4096)

    @model_validator(mode="after")
    def _consistent(self) -> PeerRoutes:
        if len(self.home_rails) != len(self.endpoints):
            raise ValueError(
                f"{len(self.endpoints)} endpoints but {len(self.home_rails)} home rails"
            )
        if self.classes and len(self.classes) != self.modulus:
            raise ValueError(f"{len(self.classes)} classes, modulus {self.modulus}")
        return self

    def same_routes(self, other: PeerRoutes | None) -> bool:
        """True when ``other`` adds the same routes (epoch, term and time aside); None =
        whole."""
        if other is None:
            return not self.classes
        a, b = self.__dict__, other.__dict__
        return all(a[k] == b[k] for k in a if k not in ("epoch", "term", "issued_at"))


class Plan(_Model):
    """All assignments for one host, retained on ``plans/<host>``. Epochs only grow.

    On a fabric with endpoint subnets a plan is compact: one :class:`PrefixRoute` per rail's
    endpoint subnet, plus /32 ``routes`` only for the endpoints the prefix route would not
    deliver (their home rail is down at the peer, ...), so its size grows with the number of
    failures, not with the fleet. Without endpoint subnets every peer endpoint gets a /32 route.
    A host that can use all its rails gets a plan with ``shared`` set and no peer /32s at
    all: those come from the :class:`PeerRoutes` of the impaired peers (:func:`expand_plan`),
    so its plan changes only when its own ports do.
    ``unreachable``: endpoints with no usable rail in common; where a prefix route covers them
    the agent installs an ``unreachable`` /32 so no packet goes out over a dead rail.
    """

    host: HostName
    epoch: Epoch
    term: Epoch = Field(
        0,
        description="the leader term of the service that issued it (0: no election); agents "
        "refuse a lower term than the highest they have seen and order by (term, epoch)",
    )
    issued_at: float = Field(ge=0)
    rail_assignments: list[RailAssignment] = Field(default_factory=list, max_length=64)
    prefix_routes: list[PrefixRoute] = Field(default_factory=list, max_length=64)
    routes: list[RouteAssignment] = Field(default_factory=list, max_length=200_000)
    backups: list[Backup] = Field(default_factory=list, max_length=64)
    unreachable: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=200_000)
    shared: SharedRoutes | None = Field(
        None, description="compact plan: routes to impaired peers come from peers/<host>"
    )

    @model_validator(mode="after")
    def _unique_destinations(self) -> Plan:
        dests = [r.destination for r in self.routes]
        if len(set(dests)) != len(dests):
            raise ValueError("plan routes a destination twice")
        _unique_prefixes(self.prefix_routes)
        for b in self.backups:
            _unique_prefixes(b.prefix_routes)
        return self

    def same_assignments(self, other: Plan | None) -> bool:
        """True when ``other`` assigns exactly the same (epoch, term and time aside)."""
        if other is None:
            return False
        # Field-wise ==, not model_dump: lists of shared frozen models compare by identity first.
        a, b = self.__dict__, other.__dict__
        return all(a[k] == b[k] for k in a if k not in ("epoch", "term", "issued_at"))


def expand_plan(plan: Plan, peers: Mapping[str, PeerRoutes]) -> Plan:
    """The full plan a compact ``plan`` stands for, given the :class:`PeerRoutes` retained for
    impaired peers (by host; the host's own and whole peers' add nothing): their /32 routes,
    ``unreachable`` endpoints and backup changes, in peer position order, exactly as the
    solver writes them into a full plan. ``(term, epoch)`` is the highest of the plan's and all
    the peers' (the epoch is what the host acks; epochs are compared within a term only). A
    plan without ``shared`` is returned as it is. Raises ValueError when a peer message names
    a rail the plan has no netdev or backup for."""
    sv = plan.shared
    if sv is None:
        return plan
    version = (plan.term, plan.epoch)
    routes: list[RouteAssignment] = list(plan.routes)
    unreachable: list[ipaddress.IPv4Address] = list(plan.unreachable)
    extra: dict[int, tuple[list[RouteAssignment], list[ipaddress.IPv4Address]]] = {
        b.rail: ([], []) for b in plan.backups
    }
    netdevs = sv.netdevs

    def route(pr: PeerRoutes, g: int, x: int) -> RouteAssignment:
        netdev, gateway = netdevs.get(x), pr.addresses.get(x)
        if netdev is None or gateway is None:
            raise ValueError(f"peer {pr.host}: rail {x} has no netdev here or no address there")
        return RouteAssignment.model_construct(
            destination=ipaddress.IPv4Address(pr.endpoints[g]),
            peer=pr.host,
            peer_gpu=g,
            rail=x,
            home_rail=pr.home_rails[g],
            netdev=netdev,
            gateway=ipaddress.IPv4Address(gateway),
        )

    for pr in sorted(peers.values(), key=lambda pr: pr.position):
        version = max(version, (pr.term, pr.epoch))
        if not pr.classes or pr.host == plan.host:
            continue
        c = (sv.position - pr.position - 1) % sv.hosts % pr.modulus
        cls = pr.classes[c]
        if len(cls.routes) % 2 or len(cls.backups) % 3:
            raise ValueError(f"peer {pr.host} class {c}: routes or backups cut short")
        n = len(pr.endpoints)
        flat = cls.routes
        for i in range(0, len(flat), 2):
            g, x = flat[i], flat[i + 1]
            if not 0 <= g < n:
                raise ValueError(f"peer {pr.host} class {c}: GPU {g} of {n}")
            if x < 0:
                unreachable.append(ipaddress.IPv4Address(pr.endpoints[g]))
            else:
                routes.append(route(pr, g, x))
        flat = cls.backups
        for i in range(0, len(flat), 3):
            r, g, x = flat[i], flat[i + 1], flat[i + 2]
            if r not in extra:
                raise ValueError(f"peer {pr.host} class {c}: the plan has no backup for rail {r}")
            if not 0 <= g < n:
                raise ValueError(f"peer {pr.host} class {c}: GPU {g} of {n}")
            if x < 0:
                extra[r][1].append(ipaddress.IPv4Address(pr.endpoints[g]))
            else:
                extra[r][0].append(route(pr, g, x))
    backups = [
        b
        if not (extra[b.rail][0] or extra[b.rail][1])
        else Backup.model_construct(  # model_copy costs 4x as much, and all is valid
            **{
                **b.__dict__,
                "routes": b.routes + extra[b.rail][0],
                "withdraw": b.withdraw + extra[b.rail][1],
            }
        )
        for b in plan.backups
    ]
    dests = [r.destination for r in routes]
    if len(set(dests)) != len(dests):
        raise ValueError("peer routes route a destination twice")
    return Plan.model_construct(
        **{
            **plan.__dict__,
            "term": version[0],
            "epoch": version[1],
            "routes": routes,
            "unreachable": unreachable,
            "backups": backups,
            "shared": None,
        }
    )


class AckResult(StrEnum):
    APPLIED = "applied"
    REFUSED = "refused"  # failed validation / stale epoch / wrong host
    FAILED = "failed"  # valid but the kernel refused part of it


class Ack(_Model):
    """Agent -> service, on ``hosts/<host>/ack`` after every plan it handled."""

    host: HostName
    epoch: Epoch
    result: AckResult
    error: str | None = Field(None, max_length=2000)
    applied_at: float = Field(ge=0)
    apply_ms: float | None = Field(None, ge=0)
    fast_path: bool = Field(False, description="applied locally from a backup, not a plan")


class BadMessage(ValueError):
    """A bus payload that cannot be accepted. ``reason`` is one of: oversized, not_json,
    invalid, wrong_host."""

    def __init__(self, reason: str, detail: str, *, topic: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" + (f" (topic {topic})" if topic else ""))
        self.reason = reason
        self.detail = detail
        self.topic = topic


M = TypeVar("M", bound=BaseModel)


def decode(
    model: type[M],
    payload: bytes | str,
    *,
    topic: str | None = None,
    expect_host: str | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> M:
    """Validate one bus payload into ``model``.

    Raises :class:`BadMessage` (never anything else) when the payload is larger than
    ``max_bytes``, not JSON, does not validate, or names another host than ``expect_host``
    (the host its topic belongs to).
    """
    size = len(payload)
    if size > max_bytes:
        raise BadMessage("oversized", f"{size} bytes > {max_bytes}", topic=topic)
    try:
        obj = model.model_validate_json(payload)
    except ValidationError as exc:
        kind = "not_json" if any(e["type"] == "json_invalid" for e in exc.errors()) else "invalid"
        errs = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        raise BadMessage(kind, f"{model.__name__}: {errs}", topic=topic) from None
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        raise BadMessage("invalid", f"{model.__name__}: {exc}", topic=topic) from None
    if expect_host is not None:
        host = getattr(obj, "host", None)
        if host != expect_host:
            raise BadMessage(
                "wrong_host", f"payload host {host!r}, expected {expect_host!r}", topic=topic
            )
    return obj


def encode(msg: BaseModel) -> bytes:
    """JSON bytes of a model (the inverse of :func:`decode`)."""
    return msg.model_dump_json().encode()


class ProbePeer(_Model):
    """One port to probe: ``host``'s HCA port on ``rail``, at its rail ``address``."""

    host: HostName
    rail: RailIndex
    address: IPv4Text


class ProbeRail(_Model):
    """The peers one local rail probes (at most 16: ``probeplan.MAX_PROBES_PER_PORT_PPS``)."""

    rail: RailIndex
    address: IPv4Text = Field(description="this host's address on the rail (probe source)")
    peers: list[ProbePeer] = Field(default_factory=list, max_length=16)


class ProbeTargets(_Model):
    """Service -> agent, retained on ``probes/<host>``: whom each of the host's rails probes
    in probe plan ``epoch`` (:mod:`linkguard.topology.probeplan`), how (``mode``/``port``,
    ``rate_pps`` probes/s to each peer, ``timeout_s``) and how often to report (``window_s``,
    :class:`ProbeReport`)."""

    host: HostName
    epoch: Epoch
    mode: Literal["udp", "roce"] = "udp"
    port: int = Field(47_910, ge=1, le=65535)
    rate_pps: float = Field(1.0, gt=0, le=16)
    timeout_s: float = Field(1.0, gt=0, le=60)
    window_s: float = Field(10.0, gt=0, le=3600)
    rails: list[ProbeRail] = Field(default_factory=list, max_length=64)


class ProbePair(_Model):
    """One window of probes from local ``rail`` to ``peer_host``'s ``peer_rail``: ``sent``
    probes whose reply deadline passed in the window, ``lost`` of them unanswered, RTT
    percentiles in milliseconds (None when nothing came back)."""

    rail: RailIndex
    peer_host: HostName
    peer_rail: RailIndex
    sent: int = Field(ge=0, le=1_000_000)
    lost: int = Field(ge=0, le=1_000_000)
    rtt_p50_ms: float | None = Field(None, ge=0, le=60_000)
    rtt_p99_ms: float | None = Field(None, ge=0, le=60_000)

    @model_validator(mode="after")
    def _lost_le_sent(self) -> ProbePair:
        if self.lost > self.sent:
            raise ValueError(f"lost {self.lost} > sent {self.sent}")
        return self


class ProbeReport(_Model):
    """Agent -> service, on ``hosts/<host>/probes`` (not retained) every ``window_s``: the
    probe results of the window ending at ``window_end`` (the agent's wall clock, Unix s;
    informational: the service dates a report by its arrival)."""

    host: HostName
    epoch: Epoch = Field(description="the ProbeTargets epoch probed")
    window_end: float = Field(ge=0)
    window_s: float = Field(gt=0, le=3600)
    pairs: list[ProbePair] = Field(default_factory=list, max_length=1024)
