"""Port usability: one raw reading -> usable, unusable (with why) or unknown, before damping.

Consumes a :class:`~linkguard.drivers.base.PortObservation` (and the port's remembered link
layer). Produces a :class:`RawVerdict`. Pure: no clock, no I/O. The port monitor
(:mod:`linkguard.agent.monitor`) damps these verdicts into port states.
"""

from __future__ import annotations

from typing import NamedTuple

from linkguard.drivers.base import PortObservation
from linkguard.models import LinkLayer, PhysState, PortStateName

__all__ = ["MAX_REASON", "RawVerdict", "raw_usability"]

#: PortState ``reason`` length limit (linkguard.models): longer values are truncated (chars)
MAX_REASON = 200


class RawVerdict(NamedTuple):
    """Instantaneous usability of one reading: ``usable`` None = unreadable (unknown)."""

    usable: bool | None
    reason: str | None


_PHYS_REASON = {
    PhysState.SLEEP: "phys_sleep",
    PhysState.POLLING: "phys_polling",
    PhysState.DISABLED: "phys_disabled",
    PhysState.PORT_CONFIGURATION_TRAINING: "phys_training",
    PhysState.LINK_ERROR_RECOVERY: "link_error_recovery",
    PhysState.PHY_TEST: "phys_test",
}


def raw_usability(obs: PortObservation, *, link_layer: LinkLayer | None = None) -> RawVerdict:
    """Classify one reading, before any damping (IBA vol. 1 14.2.5.6 PortState/PhysState).

    InfiniBand: usable iff ``state`` ACTIVE and ``phys_state`` LinkUp (phys None = decide on
    state alone). ACTIVE_DEFER -> "active_defer". INIT/ARMED with LinkUp (or phys unknown) ->
    "no_sm": no subnet manager assignment, not a cable fault. Otherwise the reason names the
    physical state ("phys_polling", "phys_disabled", "link_error_recovery", ...) or "state_down".
    Without ``state`` the netdev carrier decides (IPoIB). Ethernet (RoCE): carrier decides when
    known (False -> "no_carrier") and ``state`` must be ACTIVE when known; LID 0 / no SM is never
    a fault there. ``state`` and ``carrier`` both None, or a NOP state (IBA: "no state change",
    never a real reading), -> unknown with reason "unreadable: <first error>". A device or
    netdev that is gone (``obs.present`` False) is a real fault: unusable, reason "absent: ...".
    ``link_layer`` is the remembered one, used when the reading has none.
    """
    if not obs.present:
        detail = obs.errors[0] if obs.errors else "device gone"
        return RawVerdict(False, f"absent: {detail}"[:MAX_REASON])
    layer = obs.link_layer or link_layer
    state = None if obs.state == PortStateName.NOP else obs.state
    if state is None and obs.carrier is None:
        detail = obs.errors[0] if obs.errors else f"state {obs.state.value if obs.state else None}"
        return RawVerdict(None, f"unreadable: {detail}"[:MAX_REASON])
    if layer == LinkLayer.ETHERNET:
        if obs.carrier is False:
            return RawVerdict(False, "no_carrier")
        if state is None or state == PortStateName.ACTIVE:
            return RawVerdict(True, None)
        return RawVerdict(False, f"state_{state.value.lower()}")
    if state is None:  # IB port known only through its netdev (IPoIB)
        return RawVerdict(True, None) if obs.carrier else RawVerdict(False, "no_carrier")
    phys = obs.phys_state
    if state == PortStateName.ACTIVE:
        if phys is None or phys == PhysState.LINK_UP:
            return RawVerdict(True, None)
        return RawVerdict(False, _PHYS_REASON[phys])
    if state == PortStateName.ACTIVE_DEFER:
        return RawVerdict(False, "active_defer")
    if phys is None or phys == PhysState.LINK_UP:
        if state in (PortStateName.INIT, PortStateName.ARMED):
            return RawVerdict(False, "no_sm")
        return RawVerdict(False, "state_down")
    return RawVerdict(False, _PHYS_REASON[phys])
