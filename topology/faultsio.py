"""The topology service's switch-level faults: ``fabric/faults`` in, ``service/health`` out.

Consumes: ``fabric/faults`` messages (:class:`~linkguard.models.FabricFaults`: a complete set of
switches and cables down) and the faults a previous instance had accepted (the core's
``inherited_faults``, from the retained ``service/health``). Produces: the faults in effect
(the fabric state's health, assessed in a worker thread: a solve when usable rails change),
the set in effect put back on ``fabric/faults`` when a refused one replaced it on the broker,
and ``service/health`` (:meth:`ServiceIO._publish_health`). An effect executor of the wiring
module (:mod:`linkguard.topology.service`): it creates no task.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from linkguard import topics
from linkguard.bus import BusMessage
from linkguard.models import FabricFaults, encode
from linkguard.topology.health import Health
from linkguard.topology.integrity import Refused
from linkguard.topology.schedule import head
from linkguard.topology.serviceio import ServiceIO

__all__ = ["FaultsIO"]

log = structlog.get_logger(__name__)


class FaultsIO(ServiceIO):
    """Switch-level faults of :class:`~linkguard.topology.service.TopologyService` (a base)."""

    async def _on_fabric_faults(self, msg: BusMessage) -> None:
        """A new complete set of switch-level faults: assess it (worker thread), then put it in
        effect (:meth:`FaultsDesk.accept`) and publish ``service/health``. A set equal to the
        one in effect changes nothing (this service's own re-publish coming back). A malformed
        set, or one naming a switch or cable the fabric does not have, is refused whole
        (:meth:`_refuse`): the previous faults stay in effect."""
        desk = self.core.switch_faults
        faults = desk.read(msg.topic, msg.payload)
        if isinstance(faults, Refused):
            await self._refuse(msg, faults.reason, faults.detail)
            return
        if faults is None:
            return
        try:
            health = await asyncio.to_thread(self.core.state.assess_faults, faults)
        except ValueError as exc:  # a switch or cable the fabric does not have
            await self._refuse(msg, "invalid", str(exc))
            return
        self._accept(faults, health)
        desk.refused = None
        await self._publish_health()

    def _accept(self, faults: FabricFaults, health: Health) -> None:
        """Put ``faults`` (assessed as ``health``) in effect (a solve when usable rails
        change)."""
        desk = self.core.switch_faults
        self._execute_now(desk.accept(faults, health, time.monotonic(), time.time()))

    async def _assess_inherited(self) -> tuple[FabricFaults, Health] | None:
        """The faults of the previous instance's ``service/health`` (taken once) and their
        health; None when there are none or the fabric changed since."""
        inherited, self.core.inherited_faults = self.core.inherited_faults, None
        if inherited is None:
            return None
        try:
            health = await asyncio.to_thread(self.core.state.assess_faults, inherited)
        except ValueError as exc:  # the fabric changed since that instance accepted it
            log.warning("inherited_fabric_faults_refused", detail=str(exc)[:300])
            return None
        return inherited, health

    async def _refuse(self, msg: BusMessage, reason: str, detail: str) -> None:
        """Refuse a ``fabric/faults`` message (dropped, counted, logged); the faults in effect
        stay. Being retained, the refused message replaced the accepted set on the broker: the
        set in effect is published back, retained. Before this instance accepted any, the set
        a previous instance had accepted is put in effect and published instead. With
        neither, nothing is published (an empty set would claim that nothing is down).
        ``service/health`` then carries ``refused``."""
        desk = self.core.switch_faults
        await self._execute(self.core.drop(msg.topic, len(msg.payload), reason, detail))
        refused = desk.refusal(msg.payload, reason, detail, time.time())
        if desk.faults is None and (inherited := await self._assess_inherited()) is not None:
            self._accept(*inherited)
        if desk.faults is not None:
            await self.bus.publish(topics.fabric_faults(), encode(desk.faults), retain=True)
        self._execute_now([desk.refused_log(reason)])
        desk.refused = refused
        await self._publish_health()

    async def _adopt_inherited_faults(self) -> None:
        """After the startup settle: no set arrived on ``fabric/faults`` (the broker lost it)
        but the previous instance's health names the set it had accepted. Put that set in
        effect and publish it back (retained), rather than plan on nominal health."""
        if self.core.switch_faults.faults is not None:
            return
        assessed = await self._assess_inherited()
        if assessed is None:
            return
        inherited, health = assessed
        log.warning(
            "fabric_faults_inherited",
            reason="no retained fabric/faults after the startup settle; using the set the "
            "previous instance had accepted (service/health)",
            switches_down=head(inherited.switches_down),
            cables_down=len(inherited.cables_down),
        )
        self._accept(inherited, health)
        await self.bus.publish(topics.fabric_faults(), encode(inherited), retain=True)
        await self._publish_health()
