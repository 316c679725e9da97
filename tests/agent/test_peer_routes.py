"""Compact plans and shared peer routes through a real Mosquitto to a real agent: whatever order
the plan and the peers' messages arrive in, the agent applies exactly the full plan the solver
computes, acks the highest epoch, re-applies when a peer changes, and refuses bad ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from linkguard import topics
from linkguard.agent.applier import kernel_routes
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.agent.plans import effective
from linkguard.bus import Bus
from linkguard.config import BusSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import Ack, AckResult, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver
from tests.support import until

FABRIC = generate_rail_optimized(hosts=12, rails=4)
HOST = "gpu005"
A, B = "gpu001", "gpu009"  # the impaired peers


class Rig:
    """The agent of HOST, its table, and a sender in the service's place."""

    def __init__(self, agent: Agent, table: MemoryRouteTable, sender: Bus, acks: list[Ack]):
        self.agent, self.table, self.sender, self.acks = agent, table, sender, acks
        self.solver = Solver(FABRIC)

    async def plan(self, epoch: int) -> None:
        plan = self.solver.compact_plan(HOST, epoch=epoch, now=1.0)
        assert plan.shared is not None and plan.routes == []
        await self.sender.publish(topics.plan(HOST), encode(plan), retain=True)

    async def peers(self, host: str, epoch: int) -> None:
        pr = self.solver.peer_routes(host, epoch=epoch, now=1.0)
        await self.sender.publish(topics.peer_routes(host), encode(pr), retain=True)

    def full(self, epoch: int):
        return self.solver.plan(HOST, epoch=epoch, now=1.0)

    async def good_state(self, epoch: int) -> None:
        """Both sides connected; A's peer routes and the compact plan of ``epoch`` applied."""
        await self.sender.wait_connected(10)
        await self.agent.bus.wait_connected(10)
        await self.peers(A, epoch)
        await self.plan(epoch)
        await until(lambda: self.applied(epoch), f"the good state of epoch {epoch}")

    def applied(self, epoch: int) -> bool:
        a = self.agent.applier.plan
        return a is not None and a.epoch == epoch and a.same_assignments(self.full(epoch))


async def _rig(mosquitto, tmp: Path):
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    settings = agent_settings_for(FABRIC, HOST, bus=bus, workdir=tmp, damping=DampingPolicy())
    table = MemoryRouteTable()
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(HOST).hcas])
    agent = Agent(settings, source=source, table=table, discovered=[])
    acks: list[Ack] = []

    async def on_ack(msg) -> None:
        acks.append(decode(Ack, msg.payload))

    sender = Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="test-service",
        subscriptions=[topics.ack(HOST)],
        handler=on_ack,
    )
    return Rig(agent, table, sender, acks)


async def test_plan_then_peers_then_changes(mosquitto, tmp_path: Path) -> None:
    rig = await _rig(mosquitto, tmp_path)
    task = asyncio.create_task(rig.agent.run())
    async with rig.sender:
        await rig.sender.wait_connected(10)
        await rig.agent.bus.wait_connected(10)
        await rig.plan(10)
        await until(lambda: rig.applied(10), "the compact plan, nobody impaired")
        assert rig.agent.applier.plan.routes == []

        rig.solver.update({A: {2}})  # A lost rail 2: every whole host needs a /32 for GPU 2
        await rig.peers(A, 11)
        await until(lambda: rig.applied(11), "A's peer routes")
        routes = rig.agent.applier.plan.routes
        assert [(r.peer, r.peer_gpu, r.home_rail) for r in routes] == [(A, 2, 2)]
        assert routes[0].rail != 2 and routes[0].netdev == f"rail{routes[0].rail}"
        # the table is exactly the full plan's, and the ack names the peers' epoch
        want = kernel_routes(effective(rig.full(11), ()))
        assert rig.table.routes == want
        await until(lambda: rig.acks and rig.acks[-1].epoch == 11, "the ack of epoch 11")
        assert rig.acks[-1].result == AckResult.APPLIED

        # the fast path uses the backups the peer routes added
        rail = routes[0].rail
        hca = next(h for h in FABRIC.host(HOST).hcas if h.rail == rail)
        rig.agent.source.link_down(hca.hca)
        await until(
            lambda: rig.table.routes[routes[0].destination].netdev != routes[0].netdev,
            "the /32 for A's GPU 2 moved off the failed local rail",
        )
        want = kernel_routes(effective(rig.full(11), [f"{hca.hca}/{hca.port}"]))
        assert rig.table.routes == want
        rig.agent.source.link_up(hca.hca)

        rig.solver.update({A: set(), B: {0, 1}})  # A whole again, B lost two rails
        await rig.peers(A, 12)
        await rig.peers(B, 12)
        await until(lambda: rig.applied(12), "A whole, B impaired")
        assert {r.peer for r in rig.agent.applier.plan.routes} == {B}
        await until(lambda: rig.acks[-1].epoch == 12, "the ack of epoch 12")

        # older messages change nothing: both are counted as stale, neither is applied
        applies = rig.agent.stats.plans_applied
        await rig.peers(B, 9)
        await rig.plan(8)
        await until(lambda: rig.agent.stats.messages_dropped["stale_epoch"] == 2, "both stale")
        assert rig.agent.stats.plans_applied == applies and rig.applied(12)
    rig.agent.stop()
    await asyncio.wait_for(task, 10)


async def test_peers_retained_before_the_agent_starts(mosquitto, tmp_path: Path) -> None:
    rig = await _rig(mosquitto, tmp_path)
    rig.solver.update({A: {1}, B: {3}})
    async with rig.sender:
        await rig.sender.wait_connected(10)
        await rig.peers(A, 20)
        await rig.peers(B, 21)
        await rig.plan(19)
        task = asyncio.create_task(rig.agent.run())
        await until(lambda: rig.applied(21), "the plan expanded with both retained peers")
        assert {r.peer for r in rig.agent.applier.plan.routes} == {A, B}
        await until(lambda: rig.acks and rig.acks[-1].epoch == 21, "the ack of epoch 21")

        # the service deletes B's message (a host no longer in its fabric): B's routes go,
        # the epoch stays the one acked
        await rig.sender.publish(topics.peer_routes(B), b"", retain=True)
        await until(
            lambda: {r.peer for r in rig.agent.applier.plan.routes} == {A}, "B's routes removed"
        )
        assert rig.agent.applier.plan.epoch == 21
    rig.agent.stop()
    await asyncio.wait_for(task, 10)


async def test_bad_peer_routes_are_refused_and_change_nothing(mosquitto, tmp_path: Path) -> None:
    rig = await _rig(mosquitto, tmp_path)
    rig.solver.update({A: {2}})
    task = asyncio.create_task(rig.agent.run())
    async with rig.sender:
        await rig.good_state(30)
        before, plan_before = dict(rig.table.routes), rig.agent.applier.plan
        good = json.loads(encode(rig.solver.peer_routes(B, epoch=31, now=1.0)))

        # not JSON; another host's message on B's topic; classes not matching the modulus
        for payload in (
            b"{nope",
            json.dumps({**good, "host": A}).encode(),
            json.dumps({**good, "modulus": 3, "classes": [{"routes": []}]}).encode(),
        ):
            await rig.sender.publish(topics.peer_routes(B), payload, retain=True)
        await until(lambda: sum(rig.agent.stats.messages_dropped.values()) == 3, "three dropped")
        assert rig.agent.stats.messages_dropped == {"not_json": 1, "wrong_host": 1, "invalid": 1}

        # well-formed but unusable: a GPU B does not have -> refused, nothing applied
        rig.solver.update({B: {0}})
        bad = json.loads(encode(rig.solver.peer_routes(B, epoch=32, now=1.0)))
        for c in bad["classes"]:
            c["routes"] = [7, 1] if c["routes"] else []
        await rig.sender.publish(topics.peer_routes(B), json.dumps(bad).encode(), retain=True)
        await until(lambda: rig.agent.stats.plans_refused["invalid"] == 1, "refused")
        await until(
            lambda: rig.acks and rig.acks[-1].result == AckResult.REFUSED, "the refusal acked"
        )
        assert "GPU 7" in rig.acks[-1].error
        assert rig.table.routes == before and rig.agent.applier.plan is plan_before
    rig.agent.stop()
    await asyncio.wait_for(task, 10)


async def test_a_refused_peer_message_is_not_kept(mosquitto, tmp_path: Path) -> None:
    """A forged peers message (an endpoint outside the configured prefixes, a higher epoch)
    is dropped, not kept or persisted: the real ones after it still apply."""
    rig = await _rig(mosquitto, tmp_path)
    rig.solver.update({A: {2}})
    task = asyncio.create_task(rig.agent.run())
    async with rig.sender:
        await rig.good_state(40)
        forged = json.loads(encode(rig.solver.peer_routes(A, epoch=10**6, now=1.0)))
        forged["endpoints"][2] = "8.8.8.8"
        await rig.sender.publish(topics.peer_routes(A), json.dumps(forged).encode(), retain=True)
        await until(lambda: rig.agent.stats.messages_dropped["out_of_scope"] == 1, "dropped")
        assert rig.agent.peers[A].epoch == 40
        assert not (tmp_path / HOST / "peers" / f"{A}.json").read_bytes().count(b"8.8.8.8")
        # an older one is counted as stale; the service's next real one applies
        await rig.peers(A, 39)
        await until(lambda: rig.agent.stats.messages_dropped["stale_epoch"] == 1, "stale")
        rig.solver.update({A: set()})
        await rig.peers(A, 41)
        await until(lambda: rig.applied(41), "the real update after the forged one")
        assert rig.agent.applier.plan.routes == []
    rig.agent.stop()
    await asyncio.wait_for(task, 10)


async def test_restart_restores_plan_and_peers_from_disk_and_acks_them(
    mosquitto, tmp_path: Path
) -> None:
    """A restarted agent expands the compact plan and peer routes it persisted, announces
    the ack of that epoch (replacing whatever was retained), and the retained copies that
    arrive next change nothing: no re-apply, no table change."""
    rig = await _rig(mosquitto, tmp_path)
    rig.solver.update({A: {2}, B: {1}})
    task = asyncio.create_task(rig.agent.run())
    async with rig.sender:
        await rig.sender.wait_connected(10)
        await rig.agent.bus.wait_connected(10)
        await rig.peers(A, 50)
        await rig.peers(B, 51)
        await rig.plan(50)
        await until(lambda: rig.applied(51), "plan and both peers")
        table = dict(rig.table.routes)
        rig.agent.stop()
        await asyncio.wait_for(task, 10)
        # the service meanwhile retained a refused ack of this host (a stale one)
        stale = Ack(host=HOST, epoch=49, result=AckResult.FAILED, applied_at=1.0, error="x")
        await rig.sender.publish(topics.ack(HOST), encode(stale), retain=True)
        await until(lambda: rig.acks and rig.acks[-1].epoch == 49, "the stale ack")

        again = await _rig(mosquitto, tmp_path)
        again.agent.table.routes.update(table)  # the kernel kept them across the restart
        task = asyncio.create_task(again.agent.run())
        await until(
            lambda: rig.acks[-1].epoch == 51 and rig.acks[-1].result == AckResult.APPLIED,
            "the restarted agent's ack of what it reconciled",
        )
        assert again.agent.applier.plan.same_assignments(rig.full(51))
        await until(lambda: set(again.agent.peers) == {A, B}, "the retained peers")
        assert again.agent.stats.plans_applied == 0 and again.agent.table.routes == table
        again.agent.stop()
        await asyncio.wait_for(task, 10)
