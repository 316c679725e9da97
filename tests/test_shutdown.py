"""Stopping must stop: agents and service asked to stop while their first messages are in flight
finish within seconds, every time. On Python 3.11 asyncio.wait_for inside aiomqtt can swallow
the cancellation (CPython gh-86296); before the bus re-raised it, stops like these hung forever
now and then (SIGTERM ignored by the daemon, CI stuck)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from linkguard.config import BusSettings, PortConfig, ServiceSettings
from linkguard.topology.service import TopologyService
from tests.conftest import start_mosquitto
from tests.support import until
from tests.test_presence import FABRIC, _agent

SWAPPED = [
    PortConfig(hca="mlx5_0", rail=1, netdev="rail0", address="10.100.0.2"),
    PortConfig(hca="mlx5_1", rail=0, netdev="rail1", address="10.100.1.2"),
]


async def _start_and_stop(workdir: Path) -> int:
    """Start a service and two agents, stop them as soon as traffic flows; return how many
    tasks were still running 15 s later."""
    workdir.mkdir()
    broker = start_mosquitto(workdir)
    try:
        bus = BusSettings(port=broker.port, reconnect_min_s=0.05)
        service = TopologyService(ServiceSettings(bus=bus, startup_settle_s=0), fabric=FABRIC)
        agents = [
            _agent(broker.port, workdir / "a", "gpu900"),
            _agent(broker.port, workdir / "w", "gpu001", ports=SWAPPED),
        ]
        tasks = [asyncio.create_task(service.run())]
        tasks += [asyncio.create_task(a.run()) for a in agents]
        await until(lambda: service.state.ports, "first port state at the service")
        for a in agents:
            a.stop()
        service.stop()
        _, pending = await asyncio.wait(tasks, timeout=15)
        return len(pending)
    finally:
        broker.process.kill()
        broker.process.wait(5)


@pytest.mark.real
async def test_stop_during_traffic_always_finishes(tmp_path: Path) -> None:
    for i in range(10):
        assert await _start_and_stop(tmp_path / str(i)) == 0, f"round {i}: a task ignored stop"
