"""The switch-level faults in force while a scenario plays: switches down and cables cut.

Consumes: the scenario's primitive events (:class:`~linkguard.simulations.scenario.Event`), one
at a time. Produces: the whole :class:`~linkguard.models.FabricFaults` set in force, as an
operator publishes it retained on ``fabric/faults`` (``linkguard fabric faults``): each switch
or cable event is a change, the bus carries the complete set. Pure: no clock (the caller
passes ``at``), no bus. Used by the simulated-clock replay (:mod:`linkguard.simulations.engine`),
the real-time replay (:mod:`linkguard.simulations.live`) and the namespace lab
(:mod:`linkguard.simulations.labrun`): one bookkeeping of the operator's fault set.
"""

from __future__ import annotations

from linkguard.models import CableRef, FabricFaults
from linkguard.simulations.scenario import Event

__all__ = ["SWITCH_KINDS", "FaultSet"]

#: The event kinds that change the switch-level faults (:meth:`FaultSet.apply` takes them).
SWITCH_KINDS: frozenset[str] = frozenset({"switch_down", "switch_up", "cables_down", "cables_up"})


class FaultSet:
    """Switches down (by name) and cables cut (by switch pair, the latest
    :class:`~linkguard.models.CableRef` of each pair), changed event by event."""

    def __init__(self) -> None:
        self._switches: set[str] = set()
        self._cables: dict[tuple[str, str], CableRef] = {}

    def apply(self, e: Event) -> bool:
        """Apply ``e`` when it is a switch or cable event (:data:`SWITCH_KINDS`): a switch
        goes down or comes back, a pair's cables are cut (replacing an earlier cut of the same
        pair) or restored. True when ``e`` was one of those, False (nothing changed) for any
        other kind."""
        if e.kind == "switch_down":
            self._switches.add(e.switch_name)
        elif e.kind == "switch_up":
            self._switches.discard(e.switch_name)
        elif e.kind == "cables_down":
            self._cables[e.cable_ref.pair] = e.cable_ref
        elif e.kind == "cables_up":
            self._cables.pop(e.cable_ref.pair, None)
        else:
            return False
        return True

    def __bool__(self) -> bool:
        """True while a switch is down or a cable cut."""
        return bool(self._switches or self._cables)

    @property
    def switches(self) -> frozenset[str]:
        """The names of the switches down."""
        return frozenset(self._switches)

    @property
    def cables(self) -> tuple[CableRef, ...]:
        """The cables cut, in the order their pairs went down."""
        return tuple(self._cables.values())

    def faults(
        self, *, at: float, reason: str | None = None, sort_cables: bool = False
    ) -> FabricFaults:
        """The set in force as the bus carries it: switches sorted by name, cables in the order
        their pairs went down (``sort_cables``: sorted by pair instead). ``at``: wall-clock
        seconds since the Unix epoch (the message's ``at``); ``reason``: its ``reason``.
        Raises pydantic's ValidationError only past the model's bounds (4,096 switches, 32,768
        pairs)."""
        cables = [self._cables[k] for k in sorted(self._cables)] if sort_cables else self.cables
        return FabricFaults(
            switches_down=sorted(self._switches),
            cables_down=list(cables),
            reason=reason,
            at=at,
        )
