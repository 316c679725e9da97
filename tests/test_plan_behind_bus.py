"""Issue 21, convergence: "an agent that learns it is behind (a newer epoch referenced
elsewhere) asks for its plan". On real processes: a private Mosquitto, the topology service
(its deadline re-send set far beyond the test) and two agents in this process, gpu000 at
``bus.subscribe_qos: 0`` behind the chaos proxy (:mod:`linkguard.simulations.chaosproxy`),
which drops its new plan on the way down. No reconnect happens: only the peer routes of the
same solve (``peers/gpu000``, a newer epoch than its compact plan, with routes: the service
counts it impaired, and an impaired host gets a full plan) reveal that a plan was lost. The
agent asks (``plan-request``, reason ``behind``, with its plan's epoch) and applies the plan
the service owes it, long before any deadline re-send.

The pure rules are in tests/agent/test_behind.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.simulations.chaosproxy import Rule
from tests.support import until
from tests.test_convergence_bus import FABRIC, HOST, _acked, _service, lossy_and_direct

pytestmark = pytest.mark.real


async def test_a_lost_plan_revealed_by_a_newer_epoch_elsewhere_is_asked_for(
    mosquitto, tmp_path: Path
) -> None:
    service = _service(mosquitto.port, after_s=60.0)  # no deadline re-send within the test
    async with lossy_and_direct(service, mosquitto.port, tmp_path, lossy_qos=0) as rig:
        proxy, lossy = rig.proxy, rig.lossy
        src = rig.lossy_src
        compact = lossy.core.plan_received
        assert compact is not None and compact.shared is not None
        connects = lossy.bus.connects
        proxy.rules.append(Rule("drop", "down", topics.plan(HOST), count=1))
        with capture_logs() as logs:
            lost = FABRIC.host(HOST).hcas[0]
            src.link_down(lost.hca, lost.port)  # impaired: a full plan for it follows
            t0 = time.monotonic()
            await until(lambda: proxy.actions, "its new plan dropped")
            owed = service.state.published[HOST]
            assert owed.shared is None
            await until(
                lambda: lossy.core.plan_received == owed and _acked(service, HOST),
                "the lost plan applied and acked",
                timeout=10,
            )
            took = time.monotonic() - t0
        print(f"\nplan lost, revealed by its peer routes: applied {took:.2f} s after")
        assert proxy.actions == [("down", "drop", topics.plan(HOST))]
        assert lossy.bus.connects == connects  # no reconnect: the evidence did it
        assert lossy.applier.plan is not None
        assert lossy.applier.plan.same_assignments(owed)
        assert lossy.applier.applied_epoch == owed.epoch == service.state.acks[HOST].epoch
        behind = [e for e in logs if e["event"] == "plan_behind"]
        assert [(e["have"], e["source"]) for e in behind] == [(compact.epoch, "peer_routes")]
        answered = [e for e in logs if e["event"] == "plan_request_answered"]
        assert [(e["host"], e["reason"], e["have"]) for e in answered] == [
            (HOST, "behind", compact.epoch)
        ]
        assert not [e for e in logs if e["event"] == "host_not_acking"]
        assert service.convergence.resends == 1
        assert lossy.core.behind.asked == 1
        assert took < 8, took
