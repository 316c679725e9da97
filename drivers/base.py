"""The one interface every port driver implements.

A driver is an async source of raw observations. ``watch()`` yields lists of
:class:`PortObservation`: first a full snapshot of every port it knows, then only the ports
whose observed values changed. A value the driver could not read is ``None`` and the reason is
in ``errors``; a driver never raises for a bad value of one port.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from linkguard.models import LinkLayer, PhysState, PortStateName

__all__ = ["PortObservation", "PortSource"]


@dataclass(frozen=True)
class PortObservation:
    """One raw reading of one port.

    ``state``/``phys_state`` come from sysfs (IB) or are derived from the netdev (netlink
    driver: carrier up -> ACTIVE/LinkUp, down -> DOWN/Polling... see the driver). ``carrier`` is
    IFF_LOWER_UP of the netdev when the driver knows it. ``counters`` maps counter name to value
    (None when unreadable, e.g. ``N/A (no PMA)``); data counters (``port_*_data``) are kept in
    the sysfs unit, 4-octet words. ``saturated`` names counters stuck at their maximum.
    ``monotonic`` is ``time.monotonic()`` at the reading. ``gids`` (RoCE): the port's GID table,
    index -> GID text as sysfs ``gids/<n>`` prints it, non-zero entries only; None when the
    driver did not read it this time. ``carrier_changes``: the netdev's carrier transitions
    since it was created (rtnetlink IFLA_CARRIER_CHANGES, the same count as sysfs
    ``/sys/class/net/<dev>/carrier_changes``; u32), None when not read: a rise between two
    readings that both saw the carrier up is a flap the readings missed. ``members``: a bond
    device's member netdevs, name -> carrier (None: the member is not found), None for a
    port that is no bond.
    """

    hca: str
    port: int
    monotonic: float
    link_layer: LinkLayer | None = None
    state: PortStateName | None = None
    phys_state: PhysState | None = None
    rate_gbps: float | None = None
    netdev: str | None = None
    carrier: bool | None = None
    counters: dict[str, int | None] = field(default_factory=dict)
    saturated: frozenset[str] = frozenset()
    errors: tuple[str, ...] = ()
    #: False when the device or netdev itself is gone (hot-unplug, NIC fell off the bus):
    #: a real fault, unlike an unreadable value, so the port is unusable.
    present: bool = True
    gids: Mapping[int, str] | None = None
    #: False when ``counters`` are the values of an earlier reading, reused (the sysfs driver
    #: re-reads counters every ``counters_interval_s`` only): they may predate this reading's
    #: state (read while the port was down, say)
    counters_fresh: bool = True
    carrier_changes: int | None = None
    members: Mapping[str, bool | None] | None = None

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"

    def same_reading(self, other: PortObservation | None) -> bool:
        """Equal apart from the time of the reading."""
        if other is None:
            return False
        return (
            self.link_layer == other.link_layer
            and self.state == other.state
            and self.phys_state == other.phys_state
            and self.rate_gbps == other.rate_gbps
            and self.netdev == other.netdev
            and self.carrier == other.carrier
            and self.counters == other.counters
            and self.errors == other.errors
            and self.present == other.present
            and self.gids == other.gids
            and self.carrier_changes == other.carrier_changes
            and self.members == other.members
        )


@runtime_checkable
class PortSource(Protocol):
    """An async source of port observations."""

    def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        """Snapshot first, then changes. Runs until cancelled."""
        ...
