"""An agent restarted while one of its ports is held down (a crash loop, a package upgrade)
keeps it held down: the damping history is saved in the state dir. No broker needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import free_port
from linkguard.config import BusSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import PortStatus
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)


def _agent(tmp: Path) -> Agent:
    s = agent_settings_for(
        FABRIC,
        "gpu000",
        workdir=tmp,
        bus=BusSettings(port=free_port(), reconnect_min_s=0.05),
        damping=DampingPolicy(hold_down_initial_s=30, hold_down_max_s=300),
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.hosts[0].hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


async def test_restart_keeps_a_hold_down(tmp_path: Path) -> None:
    first = _agent(tmp_path)
    task = asyncio.create_task(first.run())
    await until(lambda: first.monitor.state("mlx5_1/1") is not None, "first reading")
    first.source.link_down("mlx5_1")
    await until(lambda: first.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
    first.source.link_up("mlx5_1")
    await until(lambda: first.monitor.state("mlx5_1/1").status == PortStatus.HELD_DOWN, "held")
    first.stop()
    await asyncio.wait_for(task, 10)
    assert (tmp_path / "gpu000" / "damping.json").exists()

    second = _agent(tmp_path)  # same state dir; its port reads ACTIVE from the start
    task = asyncio.create_task(second.run())
    try:
        await until(
            lambda: (
                second.monitor.state("mlx5_0/1") is not None
                and second.monitor.state("mlx5_1/1").status != PortStatus.UNKNOWN
            ),
            "first reading",
        )
        assert second.monitor.state("mlx5_1/1").status == PortStatus.HELD_DOWN
        assert second.monitor.state("mlx5_0/1").status == PortStatus.UP
    finally:
        second.stop()
        await asyncio.wait_for(task, 10)
