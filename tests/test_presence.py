"""Two processes claiming one identity (cloned hosts with one host name, two topology services),
the status an operator sees after a clean stop, and the service's warnings about agents that do
not match the fabric. Real Mosquitto, real agents and service in-process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent, DuplicateHostError
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, PortConfig, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import HostStatus, ServiceStatus, decode
from linkguard.presence import DuplicateInstanceError, Me, Verdict, judge
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import retained, until

FABRIC = generate_rail_optimized(hosts=2, rails=2)


def _status(instance: str, started: float, online: bool = True) -> HostStatus:
    return HostStatus(host="h", online=online, instance=instance, started_at=started)


def test_judge() -> None:
    me = Me(instance="bb", started_at=100.0)
    assert judge(me, _status("bb", 100.0), retained=False) == Verdict.IGNORE  # myself
    assert judge(me, _status("aa", 50.0), retained=True) == Verdict.IGNORE  # history
    assert judge(me, _status("aa", 50.0), retained=False) == Verdict.YIELD  # it was first
    assert judge(me, _status("cc", 150.0), retained=False) == Verdict.HOLD  # I was first
    assert judge(me, _status("aa", 100.0), retained=False) == Verdict.YIELD  # tie: by id
    assert judge(me, _status("aa", 50.0, online=False), retained=False) == Verdict.REASSERT
    legacy = HostStatus(host="h", online=True)
    assert judge(me, legacy, retained=False) == Verdict.IGNORE


def _agent(port: int, tmp: Path, host: str, **update) -> Agent:
    bus = BusSettings(port=port, reconnect_min_s=0.05)
    s = agent_settings_for(
        FABRIC, FABRIC.hosts[0].host, bus=bus, workdir=tmp, damping=DampingPolicy()
    )
    s = s.model_copy(update={"host": host, **update})
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.hosts[0].hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


@pytest.mark.real
async def test_second_agent_with_the_same_host_name_stops(mosquitto, tmp_path: Path) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    service = TopologyService(ServiceSettings(bus=bus, startup_settle_s=0), fabric=FABRIC)
    ts = asyncio.create_task(service.run())
    first = _agent(mosquitto.port, tmp_path / "a", "gpu000")
    t1 = asyncio.create_task(first.run())
    first.source.link_down("mlx5_1")  # the real host has rail 1 down
    await until(lambda: service.state.unusable() == {"gpu000": frozenset({1})}, "rail 1 down")
    # a clone (same host name, all links up) starts: it must not tell the service otherwise
    second = _agent(mosquitto.port, tmp_path / "b", "gpu000")
    dup = pytest.raises(DuplicateHostError, match="another agent is running as host 'gpu000'")
    with capture_logs() as logs, dup:
        await asyncio.wait_for(second.run(), 15)
    assert not t1.done()  # the first one keeps the host
    assert any(e["event"] == "duplicate_host" and "keeping" in e["action"] for e in logs)
    assert not [e for e in logs if e["event"] == "port_usability_changed"]
    assert service.state.unusable() == {"gpu000": frozenset({1})}
    assert second.table.routes == {}  # the clone withdrew the other machine's routes
    service.stop()
    await asyncio.wait_for(ts, 10)
    st = decode(HostStatus, await retained(mosquitto.port, topics.status("gpu000")))
    assert (st.online, st.instance) == (True, first.me.instance)

    # a clean stop leaves "offline" for operators, not a stale "online"
    first.stop()
    await asyncio.wait_for(t1, 10)
    st = decode(HostStatus, await retained(mosquitto.port, topics.status("gpu000")))
    assert st.online is False


@pytest.mark.real
async def test_second_topology_service_stops(mosquitto) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    s = ServiceSettings(bus=bus, startup_settle_s=0)
    first = TopologyService(s, fabric=FABRIC)
    t1 = asyncio.create_task(first.run())
    await first.bus.wait_connected(10)
    with pytest.raises(DuplicateInstanceError, match="another topology service"):
        await asyncio.wait_for(TopologyService(s, fabric=FABRIC).run(), 15)
    assert not t1.done()
    seen = decode(ServiceStatus, await retained(mosquitto.port, topics.service_status()))
    assert seen.instance == first.me.instance
    first.stop()
    await asyncio.wait_for(t1, 10)


@pytest.mark.real
async def test_service_warns_about_agents_that_do_not_match_the_fabric(
    mosquitto, tmp_path: Path
) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    service = TopologyService(ServiceSettings(bus=bus, startup_settle_s=0), fabric=FABRIC)
    ts = asyncio.create_task(service.run())
    stranger = _agent(mosquitto.port, tmp_path / "s", "gpu900")
    swapped = _agent(
        mosquitto.port,
        tmp_path / "w",
        "gpu001",
        ports=[
            PortConfig(hca="mlx5_0", rail=1, netdev="rail0", address="10.100.0.2"),
            PortConfig(hca="mlx5_1", rail=0, netdev="rail1", address="10.100.1.2"),
        ],
    )
    tasks = [asyncio.create_task(a.run()) for a in (stranger, swapped)]
    try:
        with capture_logs() as logs:
            await until(
                lambda: {e["event"] for e in logs} >= {"host_not_in_fabric", "inventory_mismatch"},
                "warnings",
            )
        unknown = [e for e in logs if e["event"] == "host_not_in_fabric"]
        assert len(unknown) == 1 and unknown[0]["host"] == "gpu900"  # once, not per message
        mismatch = next(e for e in logs if e["event"] == "inventory_mismatch")
        assert mismatch["problems"] == [
            "mlx5_0/1: rail 1 on the host, 0 in the fabric",
            "mlx5_1/1: rail 0 on the host, 1 in the fabric",
        ]
        assert mismatch["log_level"] == "warning"
        # the same result as a fleet audit, retained on the bus for dashboards and operators
        doc = json.loads(
            await retained(
                mosquitto.port, topics.service_audit(), until_payload=b"inventory_mismatch"
            )
        )
        # gpu001's two swapped rails; gpu000 has no agent online; gpu900 is not in the fabric
        want = {"inventory_mismatch": 2, "missing_host": 1, "unknown_host": 1}
        assert doc["counts"] == want, doc
    finally:
        for a in (stranger, swapped):
            a.stop()
        service.stop()
        await asyncio.gather(*tasks, ts, return_exceptions=True)
