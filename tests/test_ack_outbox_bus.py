"""Issue 21, convergence: an ack lost on its way up neither stalls the agent nor stays lost.
On real processes: a private Mosquitto, the topology service and two agents in this process,
one of them behind the chaos proxy (:mod:`linkguard.simulations.chaosproxy`) that drops its
``hosts/<host>/ack`` PUBLISHes towards the broker (so no PUBACK comes back: a QoS 1 publish
waits for it up to the bus's 10 s timeout).

- While the ack of one epoch is outstanding, the next peer routes (a new epoch) are applied at
  once, and the ack of that newer epoch reaches the service at once (the outbox drops the wait
  for the older one: :mod:`linkguard.agent.outbox`).
- An ack dropped twice is re-sent (the service's re-send of the plan -> the agent's
  ``ResendAck``) until the service sees the host converged, within the re-send back-off.

The outbox's own rules are in tests/agent/test_outbox.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.simulations.chaosproxy import Rule
from tests.support import until
from tests.test_convergence_bus import FABRIC, HOST, OTHER, _acked, _service, lossy_and_direct

pytestmark = pytest.mark.real

AFTER_S = 1.0  # convergence.resend_after_s


async def test_an_outstanding_ack_holds_back_neither_the_next_plan_nor_its_ack(
    mosquitto, tmp_path: Path
) -> None:
    service = _service(mosquitto.port, after_s=60.0)  # no re-send within the test
    async with lossy_and_direct(service, mosquitto.port, tmp_path, lossy_qos=1) as rig:
        proxy, lossy = rig.proxy, rig.lossy
        src = rig.direct_src
        first = lossy.applier.applied_epoch or 0
        proxy.rules.append(Rule("drop", "up", topics.ack(HOST), count=1))
        a, b = FABRIC.host(OTHER).hcas[:2]
        src.link_down(a.hca, a.port)  # peers/OTHER: a new epoch for HOST's compact plan
        await until(lambda: (lossy.applier.applied_epoch or 0) > first, "epoch 1 applied")
        e1 = lossy.applier.applied_epoch
        await until(lambda: len(proxy.actions) == 1, "its ack dropped on the way up")
        # the ack of e1 now waits for a PUBACK that never comes
        src.link_down(b.hca, b.port)  # peers/OTHER again: a newer epoch
        t0 = time.monotonic()
        await until(lambda: (lossy.applier.applied_epoch or 0) > (e1 or 0), "epoch 2 applied")
        applied_s = time.monotonic() - t0
        e2 = lossy.applier.applied_epoch
        await until(lambda: (ack := service.state.acks.get(HOST)) and ack.epoch == e2, "ack 2")
        acked_s = time.monotonic() - t0
        print(f"\nack of {e1} lost: {e2} applied {applied_s:.2f} s, acked {acked_s:.2f} s")
        assert proxy.actions == [("up", "drop", topics.ack(HOST))]
        assert e2 == service.state.acked_epoch(HOST)
        # the bus's PUBACK timeout is 10 s: before the outbox, both waited for it
        assert applied_s < 5, applied_s
        assert acked_s < 5, acked_s
        assert not len(lossy.outbox)


async def test_an_ack_lost_upstream_is_resent_until_the_service_sees_the_host_converged(
    mosquitto, tmp_path: Path
) -> None:
    service = _service(mosquitto.port, after_s=AFTER_S)
    async with lossy_and_direct(service, mosquitto.port, tmp_path, lossy_qos=1) as rig:
        proxy, lossy = rig.proxy, rig.lossy
        src = rig.direct_src
        old = service.state.acked_epoch(HOST) or 0
        connections = proxy.stats[("both", "connections")]
        # every ack of its next epoch: the first and the re-sent one are lost
        proxy.rules.append(Rule("drop", "up", topics.ack(HOST), count=2))
        with capture_logs() as logs:
            lost = FABRIC.host(OTHER).hcas[0]
            src.link_down(lost.hca, lost.port)  # peers/OTHER: a new epoch for HOST
            t0 = time.monotonic()
            await until(lambda: (service.state.acked_epoch(HOST) or 0) > old, "new plan out")
            new = service.state.acked_epoch(HOST)
            await until(lambda: _acked(service, HOST), "acked at last", timeout=15)
            took = time.monotonic() - t0
        print(f"\nack lost twice upstream: the service saw it {took:.2f} s after the change")
        drops = [a for a in proxy.actions if a[1] == "drop"]
        assert drops == [("up", "drop", topics.ack(HOST))] * 2
        assert service.state.acks[HOST].epoch == new == lossy.applier.applied_epoch
        assert proxy.stats[("both", "connections")] == connections  # no reconnect
        warned = [e for e in logs if e["event"] == "host_not_acking"]
        assert [(e["host"], e["epoch"]) for e in warned][:2] == [(HOST, new), (HOST, new)]
        resent = [e for e in logs if e["event"] == "ack_resent"]
        assert len(resent) >= 2 and all(e["epoch"] == new for e in resent)
        # re-sends after AFTER_S and 2 * AFTER_S more: the second re-send's ack arrives
        assert took < 3 * AFTER_S + 3, took
