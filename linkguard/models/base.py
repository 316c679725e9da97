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
    "BadMessage",
    "CableRef",
    "CoreTier",
    "DampingStatus",
    "EventsConfirmed",
    "FabricFaults",
    "HCAInfo",
    "HostInventory",
    "HostStatus",
    "LinkLayer",
    "ManagementHostsPerSU",
    "PhysState",
    "PortEvent",
    "PortRef",
    "PortState",
    "PortStateName",
    "PortStatus",
    "ServiceStatus",
    "SettingsModel",
    "SigningPosture",
    "SpinesPerSU",
    "decode",
    "encode",
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
#: An agent's event journal id (random hex, made with its journal file).
JournalId = Annotated[str, Field(min_length=8, max_length=32, pattern=r"^[0-9a-f]+$")]


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


class PortDisagreement(_Model):
    """A port's sysfs ``state``/``phys_state`` and its ``netdev``'s ``carrier``, while ACTIVE
    and carrier up do not go together (:mod:`linkguard.agent.linkkinds`)."""

    sysfs_state: PortStateName | None = None
    sysfs_phys_state: PhysState | None = None
    carrier: bool | None = None
    netdev: NetdevName | None = None


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
    carrier_changes: int | None = Field(
        None, ge=0, le=2**32 - 1, description="netdev IFLA_CARRIER_CHANGES; None: not read"
    )
    disagreement: PortDisagreement | None = Field(None, description="None: sources agree")
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
    # the agent's event journal (linkguard.agent.journal); None: an agent without one
    seq: int | None = Field(
        None, ge=1, le=2**63 - 1, description="this host's event number in its journal (1, 2, ...)"
    )
    journal: JournalId | None = Field(
        None, description="the journal's id: a new id starts its numbering again at 1"
    )
    held_from: int | None = Field(
        None,
        ge=1,
        le=2**63 - 1,
        description="the lowest seq the agent still holds unconfirmed: each lower one was "
        "confirmed by the service or is in the lost range",
    )
    lost_from: int | None = Field(
        None, ge=1, le=2**63 - 1, description="first seq of the events the journal dropped"
    )
    lost_to: int | None = Field(
        None, ge=1, le=2**63 - 1, description="last seq of the events the journal dropped"
    )

    @model_validator(mode="after")
    def _journal_fields(self) -> PortEvent:
        if (self.seq is None) != (self.journal is None):
            raise ValueError("seq and journal come together")
        if (self.lost_from is None) != (self.lost_to is None):
            raise ValueError("lost_from and lost_to come together")
        if self.seq is not None:
            if self.held_from is not None and self.held_from > self.seq:
                raise ValueError(f"held_from {self.held_from} is above seq {self.seq}")
            lost = (self.lost_from, self.lost_to)
            if lost[0] is not None and lost[1] is not None and not lost[0] <= lost[1] < self.seq:
                raise ValueError(f"lost {lost[0]}..{lost[1]} is no range below seq {self.seq}")
        elif self.held_from is not None or self.lost_from is not None:
            raise ValueError("held_from and lost_* need seq and journal")
        return self


class EventsConfirmed(_Model):
    """Retained on ``confirmed/<host>`` by the topology service: every event of ``host``'s
    journal ``journal`` numbered up to ``upto`` is recorded (or in a recorded gap); the agent
    forgets them and replays the rest after a reconnect (:mod:`linkguard.agent.journal`)."""

    host: HostName
    journal: JournalId
    upto: int = Field(ge=0, le=2**63 - 1, description="the highest seq with none missing below")


#: A signing key's id: the first 16 hex digits of the SHA-256 of its raw 32-byte Ed25519
#: public key (``linkguard.signing.key_id``).
KeyId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


class SigningPosture(_Model):
    """What an agent takes as a plan, as it says in its :class:`HostStatus`: ``required``
    (it drops plans and peer routes that are not signed: ``service_public_key`` set and
    ``require_signed_plans`` true) and ``key_ids`` (the ids of the public keys it verifies
    signatures with, :func:`linkguard.signing.key_id`; empty: it has no key and applies plans
    unverified). The service compares it with its own signing key
    (:mod:`linkguard.topology.posture`)."""

    required: bool
    key_ids: list[KeyId] = Field(default_factory=list, max_length=8)


class HostStatus(_Model):
    """Retained on ``hosts/<host>/status``; the broker publishes ``online=False`` as last will.

    ``instance`` (random per process) and ``started_at`` tell two processes that claim the same
    host apart (cloned machines with one host name): see :mod:`linkguard.presence`.

    ``reason`` of an offline status: ``stopped`` (the agent stopped cleanly: routes are left as
    its shutdown policy says) or ``lost`` (its last will: the broker lost the connection, the
    host or its agent may be dead); the service routes around a ``lost`` host after a grace
    period (:class:`~linkguard.config.OfflineSettings`). None (an older agent): neither.

    ``signing``: whether the agent requires signed plans and with which keys
    (:class:`SigningPosture`); None: an older agent that does not say.
    ``device_problems``: RDMA device problems found at start, one line each (a LAG
    misconfiguration: :func:`linkguard.agent.inventory.lag_problems`); None: none, or older.
    ``state_write_failing``: True while the agent cannot write a file of its ``state_dir``
    (ENOSPC, EIO, EROFS: :mod:`linkguard.agent.statewrites`); it routes from memory, but what
    it would restart from is not current, so the service flags the host. None: an older agent
    or none failing.
    """

    host: HostName
    online: bool
    reason: Literal["stopped", "lost"] | None = None
    at: float | None = None
    version: str | None = Field(None, max_length=64)
    instance: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]+$")
    started_at: float | None = Field(None, ge=0)
    signing: SigningPosture | None = None
    state_write_failing: bool | None = None
    device_problems: list[Annotated[str, Field(max_length=300)]] | None = Field(None, max_length=16)


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
