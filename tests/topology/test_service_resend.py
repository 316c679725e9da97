"""A plan the broker does not take while the connection stays up (a NATS node whose JetStream
is re-electing times the PUBACK out) is re-sent until it is taken, and a newer plan for the
same topic replaces it instead of being overwritten by the old one."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from linkguard import topics
from linkguard.config import ServiceSettings
from linkguard.membus import MemoryBroker, MemoryBus
from linkguard.models import Plan, decode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
VICTIM = topics.plan(FABRIC.host_names[1])


class _TimesOut(MemoryBus):
    """The in-memory bus whose first ``fail`` publishes on :data:`VICTIM` are not taken (the
    broker answers no PUBACK in time: ``publish`` returns False, the session stays up)."""

    fail = 2
    attempts = 0

    async def publish(self, topic: str, payload: bytes, **kw) -> bool:
        if topic == VICTIM:
            type(self).attempts += 1
            if type(self).attempts <= self.fail:
                await asyncio.sleep(0)
                return False
        return await super().publish(topic, payload, **kw)


async def test_a_plan_the_broker_did_not_take_is_resent_until_taken() -> None:
    broker = MemoryBroker()
    service = TopologyService(
        ServiceSettings(startup_settle_s=0),
        fabric=FABRIC,
        bus_factory=lambda **kw: _TimesOut(broker=broker, **kw),
    )
    with capture_logs() as logs:
        task = asyncio.create_task(service.run())
        try:
            # `solves` counts before the plans go out: wait for the failed publish itself
            await until(lambda: service.solves >= 1 and VICTIM in service.unsent, "first solve")
            assert VICTIM in service.unsent and VICTIM not in broker.retained
            # the broker holds it as soon as the publish is taken; the resender's bookkeeping
            # follows when the publish returns
            await until(
                lambda: VICTIM in broker.retained and service.unsent == {}, "re-sent", timeout=10
            )
            assert _TimesOut.attempts == 3  # the first publish and one failed retry
            plan = decode(Plan, broker.retained[VICTIM], topic=VICTIM)
            assert plan == service.state.published[FABRIC.host_names[1]]
        finally:
            service.stop()
            await asyncio.wait_for(task, 10)
    events = [e["event"] for e in logs]
    assert events.count("plans_unsent") == 1 and events.count("plans_resent") == 1
