"""The bus contract: every message linkguard sends or receives, as pydantic v2 models.

Each model is validated on every decode (:func:`decode`). Payloads are JSON. Units are in the
field names or descriptions: ``rate_gbps`` is Gb/s as in the sysfs ``rate`` file
(Documentation/ABI/stable/sysfs-class-infiniband), times are seconds.

Port state names and numbers follow the InfiniBand Architecture Specification vol. 1, 14.2.5.6
(PortInfo.PortState and PortInfo.PortPhysicalState), which is what the kernel prints in
``/sys/class/infiniband/<hca>/ports/<n>/state`` (``4: ACTIVE``) and ``phys_state`` (``5: LinkUp``).

The models live in :mod:`~linkguard.models.base` (fields, ports, hosts, statuses, faults, the
codec), :mod:`~linkguard.models.plan` (plans and acks) and :mod:`~linkguard.models.probe`
(probe targets and reports), :mod:`~linkguard.models.discovery` (what a host reports
for fabric discovery); every public name is importable from here.
"""

from __future__ import annotations

from linkguard.models.base import (
    LANE_GBPS,
    LINK_WIDTHS,
    MAX_MESSAGE_BYTES,
    MAX_PORT_RATE_GBPS,
    PORT_RATES_GBPS,
    BadMessage,
    CableRef,
    CoreTier,
    DampingStatus,
    EventsConfirmed,
    FabricFaults,
    HCAInfo,
    HostInventory,
    HostStatus,
    LinkLayer,
    ManagementHostsPerSU,
    PhysState,
    PortDisagreement,
    PortEvent,
    PortRef,
    PortState,
    PortStateName,
    PortStatus,
    ServiceStatus,
    SettingsModel,
    SigningPosture,
    SpinesPerSU,
    decode,
    encode,
    port_rate_problem,
)
from linkguard.models.base import Epoch as Epoch
from linkguard.models.base import HCAName as HCAName
from linkguard.models.base import HostName as HostName
from linkguard.models.base import NetdevName as NetdevName
from linkguard.models.base import PCIeSwitchId as PCIeSwitchId
from linkguard.models.base import PortNum as PortNum
from linkguard.models.base import RailIndex as RailIndex
from linkguard.models.base import SwitchName as SwitchName
from linkguard.models.discovery import (
    HostDiscovery,
    LldpNeighbour,
    NetdevFacts,
    RdmaPortFacts,
)
from linkguard.models.plan import (
    Ack,
    AckResult,
    Backup,
    PeerClass,
    PeerRoutes,
    Plan,
    PlanRequest,
    PrefixRoute,
    RailAssignment,
    RouteAssignment,
    SharedRoutes,
    ack_covers,
    expand_plan,
)
from linkguard.models.plan import IPv4Text as IPv4Text
from linkguard.models.probe import (
    ProbePair,
    ProbePeer,
    ProbeRail,
    ProbeReport,
    ProbeTargets,
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
    "EventsConfirmed",
    "FabricFaults",
    "HCAInfo",
    "HostDiscovery",
    "HostInventory",
    "HostStatus",
    "LinkLayer",
    "LldpNeighbour",
    "ManagementHostsPerSU",
    "NetdevFacts",
    "PeerClass",
    "PeerRoutes",
    "PhysState",
    "Plan",
    "PlanRequest",
    "PortDisagreement",
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
    "RdmaPortFacts",
    "RouteAssignment",
    "ServiceStatus",
    "SettingsModel",
    "SharedRoutes",
    "SigningPosture",
    "SpinesPerSU",
    "ack_covers",
    "decode",
    "encode",
    "expand_plan",
    "port_rate_problem",
]
