"""The agents and the topology service on a 3-node NATS cluster serving MQTT 3.1.1.

Consumes: the Debian ``nats-server`` binary (2.9; skips without it; fails under
LINKGUARD_REQUIRE_REAL=1). Produces: checks that a real service and real agents
(:class:`~linkguard.simulations.fleet.SimulatedFleet`), their sessions spread over the three
nodes, converge through the cluster's MQTT listeners and re-plan a link down; and that when
the node a service and agents are connected to is SIGKILLed, their buses fail over to the
next node of their broker list (``bus.brokers``), resubscribe, and a link down injected
afterwards is still re-planned and acked. The failover times are printed (``-s``).

What a dead node costs (nats-server 2.9.10, measured here, SIGKILL to every session back):
NATS keeps MQTT sessions, QoS 1 messages and retained messages in three R3 JetStream streams
(``$MQTT_sess``, ``$MQTT_msgs``, ``$MQTT_rmsgs``) and makes one R3 JetStream consumer per QoS
1 subscription; ``/jsz`` shows the leaders. A client that comes back (clean session, same
client id) on another node makes that node delete its old consumers and create new ones;
while the consumers' Raft groups that had a member on the dead node re-elect, those requests
time out after NATS's 4 s JetStream API timeout: CONNECT fails ("unable to delete
consumer"), SUBSCRIBE is refused (SUBACK 0x80, "Unable to add JetStream consumer"). With QoS
1 subscriptions (the default) failover took 25-44 s when the dead node led nothing (the
first failover test moves the stream leaders off it with ``$JS.API.STREAM.LEADER.STEPDOWN``)
and 18-46 s when it led the meta group: it is the consumers, not the meta leader (which the
survivors re-elect in ~5 s), that make it slow, and the service (6 filters) is the last
back. ``consumer_replicas: 1`` in the ``mqtt`` block did not help (21-31 s: the old
consumers on the dead node cannot be deleted either). With ``bus.subscribe_qos: 0`` there
are no consumers: 0.1 s, or ~10 s (one CONNECT timeout) when the dead node led
``$MQTT_sess``. The bus keeps trying throughout (next broker on a failed CONNECT, refused
subscriptions retried in the same session, the granted ones kept) and is never connected but
deaf; once the sessions are back and JetStream has its leaders, a link down is re-planned and
acked by every host in < 0.5 s.

Each node: ``server_name`` (JetStream in a cluster needs it), JetStream on with its own
``store_dir``, an ``mqtt`` listener, a ``cluster`` block routing to the other two, its NATS
client port (the JetStream API for the stepdowns) and the monitoring port (``/routez``,
``/jsz``) the fixture polls until the cluster has formed. All on free loopback ports; the
system nats-server on 127.0.0.1:4222 is never touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus
from linkguard.config import BusSettings
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.generator import generate_rail_optimized
from tests.natscluster import MQTT_STREAMS, REELECTION_S, Node, start_cluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[list[Node]]:
    """Three clustered nats-server processes with MQTT and JetStream, stopped afterwards."""
    with start_cluster(tmp_path) as nodes:
        yield nodes


class _Spread:
    """A Bus factory that gives the n-th session (the service first, then the agents) the
    broker list starting at node n mod 3, then the others: the sessions start spread over
    the three nodes and each can fail over to the other two (the fleet shares one
    BusSettings, so its ``brokers`` is replaced here)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.on: dict[str, Node] = {}
        self.buses: dict[str, Bus] = {}

    def __call__(self, **kwargs: Any) -> Bus:
        home = self.nodes[len(self.on) % len(self.nodes)]
        order = [home, *(n for n in self.nodes if n is not home)]
        self.on[kwargs["client_id"]] = home
        bus = Bus(**{**kwargs, "brokers": [("127.0.0.1", n.mqtt_port) for n in order]})
        self.buses[kwargs["client_id"]] = bus
        return bus


def _fleet(
    nodes: list[Node], tmp_path: Path, factory: _Spread, subscribe_qos: int = 1
) -> SimulatedFleet:
    bus = BusSettings(
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
        keepalive_s=5,
        subscribe_qos=subscribe_qos,
    )
    return SimulatedFleet(
        generate_rail_optimized(hosts=4, rails=2),
        bus=bus,
        workdir=tmp_path / "fleet",
        damping=DampingPolicy(hold_down_initial_s=0.5),
        debounce_ms=50,
        bus_factory=factory,
    )


async def _link_down_acked(fleet: SimulatedFleet, host: str, rail: int) -> None:
    """Take ``host``'s ``rail`` down; wait for the new plans and every host's ack of them."""
    state = fleet.service.state
    before = state.epoch
    fleet.link_down(host, rail)
    await wait_until(lambda: state.epoch > before, 60, f"the solve of {host} rail {rail} down")
    assert host in {h for h, p in state.plans.items() if p.epoch > before}
    await fleet.wait_all_acked(epoch_floor=before + 1, timeout=60)
    assert state.unusable() == {host: frozenset({rail})}
    assert fleet.agents[host].applier.applied_epoch == state.plans[host].epoch > before


def _led_by(node: Node, seen_from: Node) -> list[str]:
    """What ``node`` leads (``meta`` and MQTT stream names), as ``seen_from`` sees it."""
    return sorted(k for k, v in seen_from.leaders().items() if v == node.name)


def _settled(survivors: list[Node]) -> bool:
    """Every survivor sees a meta leader and a leader for each MQTT stream, all survivors."""
    names = {n.name for n in survivors}
    for node in survivors:
        leaders = node.leaders()
        if any(leaders.get(k) not in names for k in ("meta", *MQTT_STREAMS)):
            return False
    return True


async def _step_streams_off(nodes: list[Node], victim: Node) -> None:
    """Move the leadership of each MQTT stream ``victim`` leads to another node
    (``$JS.API.STREAM.LEADER.STEPDOWN``; the new leader is elected, so repeat until it is
    not ``victim``)."""
    other = next(n for n in nodes if n is not victim)
    deadline = time.monotonic() + REELECTION_S
    while led := [s for s in _led_by(victim, other) if s != "meta"]:
        if time.monotonic() > deadline:
            pytest.fail(f"{victim.name} still leads {led}: {other.leaders()}")
        for stream in led:
            reply = await asyncio.to_thread(
                other.js_api, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
            )
            if not reply.get("success"):
                print(f"stepdown {stream}: {reply}")  # e.g. no leader yet: try again
        await wait_until(lambda: _settled(nodes), REELECTION_S, "new stream leaders")


def _failed_over(bus: Bus, victim: Node) -> bool:
    return bus.connected.is_set() and bus.connects >= 2 and bus.broker != victim.broker


async def _kill_and_fail_over(
    fleet: SimulatedFleet, factory: _Spread, victim: Node
) -> dict[str, float]:
    """SIGKILL ``victim``; wait until every session that was on it is connected (all its
    subscriptions granted) to another node, the cluster has its leaders back, and a link
    down of an agent that was on it is re-planned and acked by every host. Returns the
    seconds from the kill to each step; prints them."""
    nodes = factory.nodes
    survivors = [n for n in nodes if n is not victim]
    moved = {cid: factory.buses[cid] for cid, n in factory.on.items() if n is victim}
    agent_host = next(h for h, a in fleet.agents.items() if a.bus in moved.values())
    led = _led_by(victim, survivors[0])
    t0 = time.monotonic()
    victim.kill()
    back: dict[str, float] = {}  # client id -> seconds from the kill to failed over

    def all_back() -> bool:
        for cid, bus in moved.items():
            if cid not in back and _failed_over(bus, victim):
                back[cid] = time.monotonic() - t0
        return len(back) == len(moved)

    t_resub = await wait_until(all_back, REELECTION_S, f"{sorted(moved)} on another node")
    t_settled = await wait_until(lambda: _settled(survivors), REELECTION_S, "JetStream leaders")
    # every session (those on the survivors too: NATS may drop them while it re-elects) is
    # back before the link down, so the plans and acks it causes have a path
    t_all = await wait_until(
        lambda: all(b.connected.is_set() for b in factory.buses.values()),
        REELECTION_S,
        "every session connected",
    )
    t_link = time.monotonic()
    epoch = fleet.service.state.epoch
    await _link_down_acked(fleet, agent_host, 0)
    t_acked = time.monotonic()
    times = {
        "resubscribed": t_resub - t0,
        "leaders_back": t_settled - t0,
        "all_connected": t_all - t0,
        "acked": t_acked - t0,
        "link_down_to_acked": t_acked - t_link,
    }
    refused = {cid: b.subscriptions_refused for cid, b in factory.buses.items()}
    print(
        f"\nkilled {victim.name} (led {led or 'nothing'}; {len(moved)} sessions on it, "
        f"{agent_host}'s agent among them): back after "
        + ", ".join(f"{cid.split('-')[1]} {s:.2f} s" for cid, s in sorted(back.items()))
        + "; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
        + f"; epoch {epoch} -> {fleet.service.state.epoch}; SUBACK refusals "
        f"{sum(refused.values())} ({ {k: v for k, v in refused.items() if v} }); "
        f"leaders now {survivors[0].leaders()}"
    )
    for cid, bus in moved.items():
        assert bus.broker in {n.broker for n in survivors}, cid
    return times


@pytest.mark.real
async def test_fleet_converges_on_nats_cluster(nats_cluster: list[Node], tmp_path: Path) -> None:
    factory = _Spread(nats_cluster)
    async with _fleet(nats_cluster, tmp_path, factory) as fleet:
        await fleet.wait_all_acked(timeout=60)
        # the sessions are on all three nodes: plans and acks cross the cluster's routes
        assert {n.name for n in factory.on.values()} == {n.name for n in nats_cluster}
        assert all(a.bus.connected.is_set() for a in fleet.agents.values())
        assert all(b.broker == factory.on[c].broker for c, b in factory.buses.items())
        await _link_down_acked(fleet, "gpu002", 1)


@pytest.mark.real
async def test_service_and_agents_fail_over_when_their_node_dies(
    nats_cluster: list[Node], tmp_path: Path
) -> None:
    """The node killed leads neither the JetStream meta group nor any MQTT stream; the service
    and a third of the agents are on it. Still slow (see the module docstring): the sessions'
    consumers have Raft peers on it."""
    nodes = nats_cluster
    meta = nodes[0].leaders()["meta"]
    victim = next(n for n in nodes if n.name != meta)
    await _step_streams_off(nodes, victim)
    assert _led_by(victim, next(n for n in nodes if n is not victim)) == []
    # the service (the first session) and a third of the agents start on the victim
    factory = _Spread([victim, *(n for n in nodes if n is not victim)])
    async with _fleet(nodes, tmp_path, factory) as fleet:
        await fleet.wait_all_acked(timeout=60)
        assert factory.on[fleet.service.bus.client_id] is victim
        await _kill_and_fail_over(fleet, factory, victim)


@pytest.mark.real
async def test_fail_over_when_the_jetstream_meta_leader_dies(
    nats_cluster: list[Node], tmp_path: Path
) -> None:
    """The node killed leads the JetStream meta group (and whatever MQTT streams it leads);
    the service and a third of the agents are on it. The survivors re-elect; the buses keep
    trying (CONNECT timeouts, SUBACK 0x80 retried) and plans flow once they are back."""
    nodes = nats_cluster
    meta = nodes[0].leaders()["meta"]
    victim = next(n for n in nodes if n.name == meta)
    factory = _Spread([victim, *(n for n in nodes if n is not victim)])
    async with _fleet(nodes, tmp_path, factory) as fleet:
        await fleet.wait_all_acked(timeout=60)
        await _kill_and_fail_over(fleet, factory, victim)


@pytest.mark.real
async def test_qos0_subscriptions_fail_over_fast_when_the_meta_leader_dies(
    nats_cluster: list[Node], tmp_path: Path
) -> None:
    """``bus.subscribe_qos: 0``: NATS serves QoS 0 subscriptions without JetStream consumers,
    so a session coming back on another node has none to delete or create. Only the session
    record (``$MQTT_sess``) is left to wait for when the dead node led that stream."""
    nodes = nats_cluster
    meta = nodes[0].leaders()["meta"]
    victim = next(n for n in nodes if n.name == meta)
    factory = _Spread([victim, *(n for n in nodes if n is not victim)])
    async with _fleet(nodes, tmp_path, factory, subscribe_qos=0) as fleet:
        await fleet.wait_all_acked(timeout=60)
        times = await _kill_and_fail_over(fleet, factory, victim)
    assert all(b.subscriptions_refused == 0 for b in factory.buses.values())
    assert times["resubscribed"] < 30  # measured 0.1-10 s; QoS 1: 17-46 s
