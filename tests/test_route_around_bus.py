"""Issue 6, part 3: "the service sees an agent's last will: that host's endpoints are routed
around until it returns", on real processes: a private Mosquitto, the topology service and two
agents in this process, and a third agent in a process of its own that is SIGKILLed (no MQTT
DISCONNECT: the broker publishes the last will the real agent set) or SIGTERMed (a clean
stop, which routes nothing around). The pure rules are in tests/topology/test_route_around.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, OfflineSettings, ServiceSettings
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_faults_survived import _agent, _stop_all

FABRIC = generate_rail_optimized(hosts=3, rails=2)
HOSTS = FABRIC.host_names
GONE = HOSTS[2]
GRACE_S = 1.5

#: a real agent (simulated ports, in-memory route table) in a process of its own
_AGENT = """
import asyncio, signal, sys
from pathlib import Path
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import load_fabric

fabric_file, host, port, workdir = sys.argv[1:5]
fabric = load_fabric(fabric_file)
s = agent_settings_for(
    fabric, host, workdir=Path(workdir),
    bus=BusSettings(port=int(port), reconnect_min_s=0.05, reconnect_max_s=0.3),
    damping=DampingPolicy(),
)
src = SimulatedPortSource([active_port(h.hca, h.port) for h in fabric.host(host).hcas])
agent = Agent(s, source=src, table=MemoryRouteTable(), discovered=[])

async def main():
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, agent.stop)
    await agent.run()

asyncio.run(main())
"""


def _spawn(tmp: Path, port: int) -> subprocess.Popen:
    fabric = tmp / "fabric.json"
    if not fabric.exists():
        fabric.write_text(dump_fabric(FABRIC))
    return subprocess.Popen(
        [sys.executable, "-c", _AGENT, str(fabric), GONE, str(port), str(tmp)],
        stdout=(tmp / f"{GONE}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )


def _unreachable_routes(agent) -> set[IPv4Address]:
    return {
        IPv4Address(str(d).split("/")[0])
        for d, r in agent.table.routes.items()
        if r.kind == "unreachable"
    }


@pytest.mark.real
async def test_last_will_routes_around_the_host_until_it_returns(mosquitto, tmp_path: Path):
    port = mosquitto.port
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
            startup_settle_s=0,
            offline=OfflineSettings(route_around_after_s=GRACE_S, max_fraction=0.34),
        ),
        fabric=FABRIC,
    )
    damping = DampingPolicy(hold_down_initial_s=60)
    agents = {h: _agent(tmp_path, h, port, damping) for h in HOSTS[:2]}
    tasks = [asyncio.create_task(service.run())]
    tasks += [asyncio.create_task(a.run()) for a in agents.values()]
    gone = _spawn(tmp_path, port)
    endpoints = {IPv4Address(e) for e in FABRIC.host(GONE).endpoints}
    try:
        await until(
            lambda: (
                all(
                    h in service.state.plans
                    and a.applier.applied_epoch == service.state.plans[h].epoch > 0
                    for h, a in agents.items()
                )
                and service.state.acks.get(GONE) is not None
            ),
            "first plans applied everywhere",
            timeout=20,
        )
        nominal = {h: dict(a.table.routes) for h, a in agents.items()}
        gone_epoch = service.state.published[GONE].epoch
        assert all(not _unreachable_routes(a) for a in agents.values())

        gone.send_signal(signal.SIGKILL)  # no DISCONNECT: the broker sends the last will
        killed = time.monotonic()
        assert gone.wait(5) == -signal.SIGKILL
        await until(lambda: GONE in service.state.lost, "the last will reaches the service")
        seen = time.monotonic()
        for a in agents.values():
            await until(lambda a=a: _unreachable_routes(a) == endpoints, "routed around")
        routed = time.monotonic()
        print(
            f"\nlast will after {1000 * (seen - killed):.0f} ms; peers route around "
            f"{1000 * (routed - killed):.0f} ms after the SIGKILL (grace {GRACE_S} s)"
        )
        assert routed - seen >= GRACE_S - 0.05  # never before the grace period
        assert service.state.away == {GONE}
        # its own plan was not re-issued: a returning agent must not start from a plan
        # without a usable rail
        assert service.state.published[GONE].epoch == gone_epoch

        gone = _spawn(tmp_path, port)  # the agent comes back
        for h, a in agents.items():
            await until(lambda a=a, h=h: a.table.routes == nominal[h], "routes back", timeout=20)
        assert service.state.away == set() and service.state.online[GONE] is True
        await until(
            lambda: service.state.acks[GONE].epoch >= service.state.acked_epoch(GONE),
            "the returning agent acks its plan",
            timeout=20,
        )

        # a clean stop (SIGTERM) is not a lost host: nothing is routed around
        gone.send_signal(signal.SIGTERM)
        assert gone.wait(15) == 0
        await until(lambda: service.state.online[GONE] is False, "the clean stop's status")
        assert service.state.lost == {} and service.state.away == set()
        assert all(a.table.routes == nominal[h] for h, a in agents.items())
    finally:
        gone.kill()
        gone.wait(5)
        await _stop_all(list(agents.values()), tasks, service)
