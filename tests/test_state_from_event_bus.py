"""Issue 21, found by the lab chaos run: an agent's retained port state lost on a bus that
stays up (a subscriber queue the broker overflowed, a lossy hop) left the service with the old
state until the agent's next refresh (30 s) or reconnect, planning around a port that was up or
through one that was down. The journaled port event of the same change is re-sent until the
service confirms it, and now also brings the service's view of the port up to date
(:meth:`linkguard.topology.state.FabricState.state_from_event`).

Real processes: a private Mosquitto, the topology service, and the agent of gpu000 behind the
chaos proxy, which drops the agent's ``hosts/<host>/ports/mlx5_1/1`` PUBLISH once on its way
up. The pure rule is in tests/topology/test_state_from_event.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from linkguard import topics
from linkguard.config import BusSettings, ServiceSettings
from linkguard.models import PortStatus
from linkguard.simulations.chaosproxy import ChaosProxy, Rule
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_journal_outages import FABRIC, ME, _stop_agents
from tests.test_journal_resend_bus import _lossy_agent

pytestmark = pytest.mark.real


async def test_a_lost_port_state_is_brought_by_its_journaled_event(
    mosquitto, tmp_path: Path
) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05, reconnect_max_s=0.3)
    service = TopologyService(ServiceSettings(bus=bus, startup_settle_s=0), fabric=FABRIC)
    svc_task = asyncio.create_task(service.run())
    key = (ME, "mlx5_1/1")
    async with ChaosProxy("127.0.0.1", mosquitto.port, seed=5) as proxy:
        me = _lossy_agent(tmp_path, proxy.port)
        tasks = [asyncio.create_task(me.run())]
        try:
            await until(lambda: (me.applier.applied_epoch or 0) > 0, "first plan applied", 20)
            await until(lambda: key in service.state.ports, "the service has the port")
            assert service.state.ports[key].status == PortStatus.UP
            epoch = service.state.acked_epoch(ME)
            journal = me.core.journal
            assert journal is not None
            recorded: list = []
            record = journal.record

            def tapped(events, _r=record):  # the events the journal numbers, unchanged
                sent = _r(events)
                recorded.extend(sent)
                return sent

            journal.record = tapped  # type: ignore[method-assign]
            rule = Rule("drop", "up", topics.port_state(ME, "mlx5_1", 1), count=1)
            proxy.rules.append(rule)
            t0 = time.monotonic()
            me.source.link_down("mlx5_1")
            await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
            await until(lambda: len(proxy.actions) == 1, "the chaos proxy dropped the state")
            down = next(e for e in recorded if e.current == PortStatus.DOWN)
            await until(
                lambda: service.state.ports[key].status == PortStatus.DOWN,
                "the service sees the port down",
                timeout=10,
            )
            took = time.monotonic() - t0
            print(f"\nport state dropped: the service saw the port down {took:.2f} s later")
            st = service.state.ports[key]
            assert proxy.actions == [("up", "drop", rule.topic)]
            assert me.bus.connects == 1  # no reconnect, no refresh: the event brought it
            assert st.observed_at == pytest.approx(down.at, abs=1e-6)  # the agent's time
            assert not st.usable
            assert took < 5, took  # the agent's refresh would take 30 s
            # and the service planned around it: a newer epoch owed to gpu000
            await until(lambda: (service.state.acked_epoch(ME) or 0) > (epoch or 0), "re-plan")
        finally:
            await _stop_agents({ME: me}, tasks)
            service.stop()
            async with asyncio.timeout(15):
                await svc_task
