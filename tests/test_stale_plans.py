"""Retained plans of hosts the service's fabric does not list (the fleet shrank, or the service
restarted on another fabric): the service deletes them from the broker (a zero-length retained
publish) once it is sure it is the only service; a running agent of such a host keeps its routes.
Real Mosquitto, service and agents in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusMessage
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import PeerRoutes, Plan, decode, encode
from linkguard.presence import DuplicateInstanceError
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from linkguard.topology.solver import Solver
from tests.support import until

BIG = generate_rail_optimized(hosts=4, rails=2)  # gpu000..gpu003
SMALL = generate_rail_optimized(hosts=2, rails=2)  # the fleet shrank: gpu000, gpu001
GONE = ["gpu002", "gpu003"]
MARKER = "linkguard-test/marker"


def _bus(port: int) -> BusSettings:
    return BusSettings(port=port, reconnect_min_s=0.05)


def _service(port: int, fabric: Fabric, settle_s: float = 0) -> TopologyService:
    settings = ServiceSettings(bus=_bus(port), solve={"short_ms": 0}, startup_settle_s=settle_s)
    return TopologyService(settings, fabric=fabric)


@contextlib.asynccontextmanager
async def _running(service: TopologyService) -> AsyncIterator[TopologyService]:
    """``service`` running until the block ends, its first plans published."""
    task = asyncio.create_task(service.run())
    try:
        await until(lambda: service.plans_published >= len(service.fabric.hosts), "the first plans")
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)


async def _retained_plans(port: int) -> dict[str, Plan]:
    """Every plan retained on the broker now, by host. The reader subscribes to the plans,
    then to a retained marker: Mosquitto sends one subscription's retained messages before it
    handles the next SUBSCRIBE, so the marker arrives after the last retained plan."""
    plans: dict[str, Plan] = {}
    done = asyncio.Event()

    async def on_message(msg: BusMessage) -> None:
        if msg.topic == MARKER:
            done.set()
        elif msg.retain and not done.is_set():
            plan = decode(Plan, msg.payload)
            plans[plan.host] = plan

    async with Bus(host="127.0.0.1", port=port, client_id="marker") as marker:
        await marker.wait_connected(10)
        assert await marker.publish(MARKER, b"end", retain=True)
    async with Bus(
        host="127.0.0.1",
        port=port,
        client_id="plan-reader",
        subscriptions=[topics.all_plans(), MARKER],
        handler=on_message,
    ):
        await asyncio.wait_for(done.wait(), 10)
    return plans


def _agent(host: str, port: int, workdir: Path) -> tuple[Agent, MemoryRouteTable]:
    settings = agent_settings_for(
        BIG, host, bus=_bus(port), workdir=workdir, damping=DampingPolicy()
    )
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in BIG.host(host).hcas])
    table = MemoryRouteTable()
    return Agent(settings, source=source, table=table, discovered=[]), table


@pytest.mark.real
async def test_plans_of_hosts_the_fabric_lost_are_cleared(mosquitto, tmp_path: Path) -> None:
    async with _running(_service(mosquitto.port, BIG)):
        pass
    old = await _retained_plans(mosquitto.port)
    assert sorted(old) == [h.host for h in BIG.hosts]

    # gpu003's agent runs on: it applied its plan of the big fabric
    agent, table = _agent("gpu003", mosquitto.port, tmp_path)
    agent_task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.applier.applied_epoch == old["gpu003"].epoch, "BIG's plan")
        routes, changes = dict(table.routes), table.changes
        assert routes

        with capture_logs() as logs:
            async with _running(_service(mosquitto.port, SMALL)) as service:
                cleared = lambda: [e for e in logs if e["event"] == "stale_plan_cleared"]  # noqa: E731
                await until(lambda: len(cleared()) == 2, "both stale plans cleared")
                # the clear reached the running agent: "no plan", its routes stay
                await until(
                    lambda: any(e["event"] == "plan_cleared" for e in logs), "the agent told"
                )
                now = await _retained_plans(mosquitto.port)
                assert sorted(now) == ["gpu000", "gpu001"]
                assert all(now[h].epoch == service.state.plans[h].epoch for h in now)
        assert sorted((e["host"], e["epoch"]) for e in cleared()) == [
            (h, old[h].epoch) for h in GONE
        ]
        assert all(e["log_level"] == "info" for e in cleared())
        assert [e["host"] for e in logs if e["event"] == "plan_cleared"] == ["gpu003"]
        assert agent.stats.messages_dropped == {} and agent.stats.plans_refused == {}
        assert agent.applier.applied_epoch == old["gpu003"].epoch
        assert table.routes == routes and table.changes == changes
    finally:
        agent.stop()
        await asyncio.wait_for(agent_task, 10)


@pytest.mark.real
async def test_a_duplicate_service_on_another_fabric_clears_nothing(mosquitto) -> None:
    """A second service (another fabric) on the broker yields to the running one during its
    startup settle: it must not delete the running service's plans before it stops."""
    async with _running(_service(mosquitto.port, BIG)):
        before = await _retained_plans(mosquitto.port)
        newcomer = _service(mosquitto.port, SMALL, settle_s=0.5)
        with capture_logs() as logs, pytest.raises(DuplicateInstanceError):
            await asyncio.wait_for(newcomer.run(), 10)
        assert not [e for e in logs if e["event"] == "stale_plan_cleared"]
        after = await _retained_plans(mosquitto.port)
        assert {h: p.epoch for h, p in after.items()} == {h: p.epoch for h, p in before.items()}


@pytest.mark.real
async def test_peer_routes_of_hosts_the_fabric_lost_are_cleared(mosquitto, tmp_path: Path) -> None:
    """gpu003 of the big fabric had lost a rail: every host had its peer routes. The service
    of the shrunk fabric deletes them (``stale_peers_cleared``); its own hosts' stay."""
    solver = Solver(BIG, {"gpu003": {1}, "gpu001": {0}})
    async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="old-service") as old:
        await old.wait_connected(10)
        for h in ("gpu001", "gpu003"):
            pr = solver.peer_routes(h, epoch=77, now=1.0)
            assert await old.publish(topics.peer_routes(h), encode(pr), retain=True)
    with capture_logs() as logs:
        async with _running(_service(mosquitto.port, SMALL)) as service:
            await until(
                lambda: any(e["event"] == "stale_peers_cleared" for e in logs), "the clearing"
            )
            # gpu001 is in the small fabric and whole now: its message is replaced, not cut
            await until(lambda: service.state.peers["gpu001"].classes == [], "gpu001 whole")
    cleared = [(e["host"], e["epoch"]) for e in logs if e["event"] == "stale_peers_cleared"]
    assert cleared == [("gpu003", 77)]
    got: dict[str, bytes] = {}
    done = asyncio.Event()

    async def on_message(msg: BusMessage) -> None:
        if msg.topic == MARKER:
            done.set()
        elif msg.retain:
            got[msg.topic] = msg.payload

    async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="m") as marker:
        await marker.wait_connected(10)
        assert await marker.publish(MARKER, b"end", retain=True)
    async with Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="peers-reader",
        subscriptions=[topics.all_peer_routes(), MARKER],
        handler=on_message,
    ):
        await asyncio.wait_for(done.wait(), 10)
    assert sorted(got) == [topics.peer_routes("gpu001")]
    assert decode(PeerRoutes, got[topics.peer_routes("gpu001")]).classes == []
