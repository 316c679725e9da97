"""Malformed, oversized, wrong-host, stale-epoch and out-of-scope bus messages, sent through a
real Mosquitto to a real agent and a real topology service: logged, dropped, nothing applied."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import Ack, PortState, PortStatus, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from linkguard.topology.solver import solve
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOST = FABRIC.hosts[0].host
OTHER = FABRIC.hosts[1].host


def _down_state() -> PortState:
    """HOST's mlx5_0/1 reported down now, as its agent would publish it."""
    return PortState(
        host=HOST,
        hca="mlx5_0",
        port=1,
        status=PortStatus.DOWN,
        usable=False,
        observed_at=time.time(),
        seq=1,
    )


def _plan_bytes(epoch: int, host: str = HOST, **edit: object) -> bytes:
    plan = solve(FABRIC, {}, epoch=epoch, now=1.0)[host]
    doc = json.loads(encode(plan))
    doc.update(edit)
    return json.dumps(doc).encode()


@pytest.fixture
async def agent_on_bus(mosquitto, tmp_path: Path):
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05, max_message_bytes=256 * 1024)
    settings = agent_settings_for(FABRIC, HOST, bus=bus, workdir=tmp_path, damping=DampingPolicy())
    table = MemoryRouteTable()
    inv = FABRIC.host(HOST)
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in inv.hcas])
    agent = Agent(settings, source=source, table=table, discovered=[])
    acks: list[Ack] = []

    async def on_ack(msg) -> None:
        acks.append(decode(Ack, msg.payload))

    task = asyncio.create_task(agent.run())
    async with Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="test-sender",
        subscriptions=[topics.ack(HOST)],
        handler=on_ack,
    ) as sender:
        await sender.wait_connected(10)
        await agent.bus.wait_connected(10)
        await sender.publish(topics.plan(HOST), _plan_bytes(10), retain=True)
        await until(lambda: agent.applier.applied_epoch == 10, "the valid plan")
        yield agent, table, sender, acks
    agent.stop()
    await asyncio.wait_for(task, 10)


@pytest.mark.real
@pytest.mark.parametrize(
    ("payload", "counter", "reason"),
    [
        (b"{not json", "messages_dropped", "not_json"),
        (b"\xff\xfe\x00garbage", "messages_dropped", "not_json"),
        (b" " * (300 * 1024), "messages_dropped", "oversized"),
        (_plan_bytes(11, host=OTHER), "messages_dropped", "wrong_host"),
        (_plan_bytes(11, issued_at=-3), "messages_dropped", "invalid"),
        (_plan_bytes(11, surprise="field"), "messages_dropped", "invalid"),
        (_plan_bytes(5), "plans_refused", "stale_epoch"),
    ],
    ids=[
        "malformed",
        "binary",
        "oversized",
        "wrong-host",
        "negative-time",
        "unknown-field",
        "stale",
    ],
)
async def test_agent_drops_bad_plan(
    agent_on_bus, payload: bytes, counter: str, reason: str
) -> None:
    agent, table, sender, _ = agent_on_bus
    before = dict(table.routes)
    changes = table.changes
    with capture_logs() as logs:
        await sender.publish(topics.plan(HOST), payload)
        await until(lambda: getattr(agent.stats, counter)[reason] == 1, f"{reason} counted")
    assert agent.applier.applied_epoch == 10
    assert table.routes == before and table.changes == changes
    logged = [e for e in logs if e.get("reason") == reason]
    assert logged and logged[0]["log_level"] == "warning"


@pytest.mark.real
async def test_agent_refuses_out_of_scope_plan_and_acks_the_refusal(agent_on_bus) -> None:
    agent, table, sender, acks = agent_on_bus
    doc = json.loads(_plan_bytes(11))
    other = FABRIC.host(OTHER).hcas[0]
    doc["routes"] = [  # a /32 outside the endpoint prefixes
        {
            "destination": "192.0.2.1",
            "peer": OTHER,
            "peer_gpu": 0,
            "rail": 0,
            "home_rail": 0,
            "netdev": FABRIC.host(HOST).hcas[0].netdev,
            "gateway": str(other.address),
        }
    ]
    await sender.publish(topics.plan(HOST), json.dumps(doc).encode())
    await until(lambda: agent.stats.plans_refused["out_of_scope"] == 1, "refusal")
    await until(lambda: any(a.epoch == 11 for a in acks), "refusal ack")
    ack = next(a for a in acks if a.epoch == 11)
    assert ack.result == "refused" and "192.0.2.1" in ack.error
    assert agent.applier.applied_epoch == 10
    assert "192.0.2.1" not in {str(d) for d in table.routes}
    # the agent still applies the next good plan
    await sender.publish(topics.plan(HOST), _plan_bytes(12))
    await until(lambda: agent.applier.applied_epoch == 12, "next good plan")


@pytest.mark.real
async def test_service_drops_bad_port_states(mosquitto) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05, max_message_bytes=64 * 1024)
    service = TopologyService(
        ServiceSettings(bus=bus, solve={"short_ms": 0}, startup_settle_s=0), fabric=FABRIC
    )
    task = asyncio.create_task(service.run())
    good = _down_state()
    forged = good.model_copy(update={"host": OTHER})
    cases = [
        (topics.port_state(HOST, "mlx5_0", 1), b"not json", "not_json"),
        (topics.port_state(HOST, "mlx5_0", 1), b"{" * 70_000, "oversized"),
        (topics.port_state(HOST, "mlx5_0", 1), encode(forged), "wrong_host"),
        (topics.port_state(HOST, "mlx5_1", 1), encode(good), "wrong_port"),
        (
            topics.ack(HOST),
            encode(Ack(host=OTHER, epoch=1, result="applied", applied_at=1.0)),
            "wrong_host",
        ),
        (topics.ack(HOST), b'{"host": "x"}', "invalid"),
    ]
    try:
        async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="forger") as forger:
            await forger.wait_connected(10)
            await service.bus.wait_connected(10)
            await until(lambda: service.solves >= 1, "first solve")
            with capture_logs() as logs:
                for topic, payload, _ in cases:
                    await forger.publish(topic, payload)
                await until(lambda: sum(service.dropped.values()) == len(cases), "all dropped")
            assert service.dropped == {
                "not_json": 1,
                "oversized": 1,
                "wrong_host": 2,
                "wrong_port": 1,
                "invalid": 1,
            }
            assert {e["topic"] for e in logs if e["event"] == "message_dropped"} == {
                t for t, _, _ in cases
            }
            assert service.state.unusable() == {}
            # a genuine state still gets through and is acted on
            await forger.publish(topics.port_state(HOST, "mlx5_0", 1), encode(good))
            await until(lambda: service.state.unusable() == {HOST: frozenset({0})}, "real down")
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)


@pytest.mark.real
async def test_a_change_during_a_solve_gets_its_own_solve(mosquitto, monkeypatch) -> None:
    """The solver runs in a thread; a port going down meanwhile must trigger another solve
    (it once cleared the wake-up and waited forever with the change unplanned)."""
    import threading

    from linkguard.topology.state import FabricState

    started = threading.Event()
    compute = FabricState.compute

    def slow_compute(self, *args, **kwargs):  # the real solver, with a wide window for the race
        started.set()
        time.sleep(0.3)
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(FabricState, "compute", slow_compute)
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    service = TopologyService(
        ServiceSettings(bus=bus, solve={"short_ms": 0}, startup_settle_s=0), fabric=FABRIC
    )
    task = asyncio.create_task(service.run())
    try:
        async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="agent-ish") as agent:
            await agent.wait_connected(10)
            await until(started.is_set, "first solve running")
            down = _down_state()
            await agent.publish(topics.port_state(HOST, "mlx5_0", 1), encode(down))
            ep = FABRIC.host(HOST).endpoints[0]
            await until(
                lambda: (
                    OTHER in service.state.plans
                    and any(
                        r.destination == ep and r.rail != 0
                        for r in service.state.plans[OTHER].routes
                    )
                ),
                "a plan that routes around the down port",
            )
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)


@pytest.mark.real
async def test_agent_takes_a_cleared_plan_as_no_plan(agent_on_bus) -> None:
    """A zero-length retained plan is MQTT's deletion (the service clears plans of hosts its
    fabric does not list): not a bad message; the routes stay; logged once per clear, again
    only after a plan arrived in between."""
    agent, table, sender, _ = agent_on_bus
    before, changes = dict(table.routes), table.changes
    with capture_logs() as logs:
        cleared = lambda: [e for e in logs if e["event"] == "plan_cleared"]  # noqa: E731
        await sender.publish(topics.plan(HOST), b"", retain=True)
        await until(lambda: len(cleared()) == 1, "the clear noticed")
        await sender.publish(topics.plan(HOST), b"", retain=True)
        await sender.publish(topics.plan(HOST), _plan_bytes(11), retain=True)
        await until(lambda: agent.applier.applied_epoch == 11, "the next plan")
        assert len(cleared()) == 1  # the second clear, before plan 11, said nothing
        await sender.publish(topics.plan(HOST), b"", retain=True)
        await until(lambda: len(cleared()) == 2, "a clear after plan 11")
    assert cleared()[0]["host"] == HOST and cleared()[0]["applied_epoch"] == 10
    assert cleared()[1]["applied_epoch"] == 11
    assert agent.stats.messages_dropped == {} and agent.stats.plans_refused == {}
    assert table.routes == before and table.changes == changes  # plan 11 = plan 10's routes
    assert not [e for e in logs if e["event"] == "message_dropped"]
