"""Link evidence beyond the port's own state: a netdev's carrier and ``carrier_changes`` next
to the sysfs state, and a bond device's member netdevs.

Consumes a :class:`~linkguard.drivers.base.PortObservation` (sysfs state merged with the
netdev's carrier, :class:`~linkguard.drivers.merged.CarrierMergedSource`) and the port's
:class:`~linkguard.agent.portrecord.PortRecord`. Produces, for the port monitor
(:mod:`linkguard.agent.monitor`): a missed flap to count, the DEGRADED reason of a bond with
a member down, and the sources' disagreement to publish. Pure: no clock, no I/O. The rules
(docs/operations.md "Device naming and link kinds"):

* **A flap the poll missed.** ``carrier_changes`` (IFLA_CARRIER_CHANGES: +1 per carrier
  on/off, include/uapi/linux/if_link.h) rising between two usable readings whose carrier is
  up is a flap no reading saw (a link that went down and up between two 100 ms polls): it is
  counted as one flap, damped like any other (the port is HELD_DOWN for the hold-down). A
  reading that is not usable forgets the count (the flap is the one the monitor sees); a
  count that falls (netdev re-created) is taken as the new base, no flap.
* **A bond** (a device with ``members``): its carrier decides UP/DOWN as any RoCE netdev's;
  with every member without carrier it is unusable (``"bond members without carrier: ..."``);
  with some it is DEGRADED, reason ``"bond members without carrier: ens1f1np1 (1/2 up)"``
  (a member not found reads ``absent``); a bond without members is DEGRADED too.
* **Disagreement.** A port whose sysfs ``state`` is known and whose netdev ``carrier`` is
  known, where ACTIVE and carrier up do not go together, is published with both readings
  (:class:`~linkguard.models.PortDisagreement`). For InfiniBand the sysfs state stays the
  verdict (the IPoIB netdev is evidence: its carrier may be off for reasons of its own, an
  admin-down ``ib0``); for RoCE the carrier already decides (``no_carrier``).
"""

from __future__ import annotations

from linkguard.agent.portrecord import PortRecord
from linkguard.agent.usability import MAX_REASON, RawVerdict
from linkguard.drivers.base import PortObservation
from linkguard.models import PortDisagreement, PortStateName

__all__ = ["bond_reason", "bond_verdict", "disagreement", "missed_flap"]


def bond_reason(obs: PortObservation) -> str | None:
    """Why a bond device is short of members (``"bond members without carrier: ens1f1np1
    (1/2 up)"``, ``"bond without members"``), None when every member has carrier or the port
    is no bond (``members`` None)."""
    members = obs.members
    if members is None:
        return None
    if not members:
        return "bond without members"
    down = [
        f"{name}{'' if carrier is False else ' absent'}"
        for name, carrier in sorted(members.items())
        if carrier is not True
    ]
    if not down:
        return None
    up = len(members) - len(down)
    return f"bond members without carrier: {', '.join(down)} ({up}/{len(members)} up)"[:MAX_REASON]


def bond_verdict(verdict: RawVerdict, obs: PortObservation) -> RawVerdict:
    """``verdict``, made unusable when the port is a bond whose members all lack carrier
    (the bond's own carrier said up: its members are the cables)."""
    members = obs.members
    if verdict.usable is not True or not members or any(c is True for c in members.values()):
        return verdict
    return RawVerdict(False, bond_reason(obs))


def disagreement(obs: PortObservation) -> PortDisagreement | None:
    """Both readings when the sysfs state and the netdev carrier disagree (ACTIVE without
    carrier, or carrier without ACTIVE), else None. A reading without a ``carrier`` or a
    ``state`` has nothing to disagree with."""
    if obs.carrier is None or obs.state is None or obs.state == PortStateName.NOP:
        return None
    if (obs.state == PortStateName.ACTIVE) == obs.carrier:
        return None
    return PortDisagreement(
        sysfs_state=obs.state,
        sysfs_phys_state=obs.phys_state,
        carrier=obs.carrier,
        netdev=obs.netdev,
    )


def missed_flap(p: PortRecord, obs: PortObservation, *, usable: bool) -> str | None:
    """The reason of a flap between readings that none of them saw
    (``"carrier_changes 4 -> 6 while usable"``), else None; keeps the port's base count in
    ``p.carrier_base``. Counted only when this reading and the one the base was taken at are
    usable with carrier up (see the module docstring)."""
    count = obs.carrier_changes
    if count is None:
        return None
    if not usable:
        p.carrier_base = None  # the monitor sees this flap itself
        return None
    if obs.carrier is not True:
        return None  # under way (a disagreement): counted when the carrier is back
    base, p.carrier_base = p.carrier_base, count
    if base is None or count <= base:
        return None
    return f"carrier_changes {base} -> {count} while usable"
