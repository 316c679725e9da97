"""The in-memory bus (linkguard.membus) against the real one: each semantic scenario runs on
the real Bus over a private Mosquitto and on MemoryBus, with the same assertions; then the
fleet simulator (real service, real agents) on the memory bus."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from linkguard import topics
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusMessage, Will
from linkguard.config import BusSettings
from linkguard.membus import MemoryBroker, MemoryBus, matches
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.generator import generate_rail_optimized
from tests.support import until


@dataclass
class Env:
    """One broker kind, driven the same way by every scenario."""

    name: str
    make: Callable[..., Any]  # Bus / MemoryBus keyword arguments -> a bus
    stop: Callable[[], None]  # broker outage begins
    start: Callable[[], None]  # ... and ends
    kill: Callable[[Any], None]  # cut one bus's connection without a DISCONNECT


def _cut(bus: Bus) -> None:
    """Shut the real client's TCP socket: the broker reads EOF without a DISCONNECT."""
    bus._client._client.socket().shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]


@pytest.fixture(params=[pytest.param("mosquitto", marks=pytest.mark.real), "memory"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    fast = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.2}
    if request.param == "mosquitto":
        m = request.getfixturevalue("mosquitto").handle
        yield Env(
            "mosquitto",
            lambda **kw: Bus(host=m.host, port=m.port, **{**fast, **kw}),
            m.stop,
            m.start,
            _cut,
        )
    else:
        broker = MemoryBroker()
        yield Env(
            "memory",
            lambda **kw: broker.bus_factory(host="x", port=1, **{**fast, **kw}),
            broker.stop,
            broker.start,
            lambda bus: broker.kill_client(bus.client_id),
        )


class Inbox:
    """A handler that records (topic, payload, retain) and the task that ran it."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, bool]] = []
        self.tasks: set[str] = set()

    async def __call__(self, msg: BusMessage) -> None:
        self.got.append((msg.topic, msg.payload, msg.retain))
        self.tasks.add(asyncio.current_task().get_name())  # type: ignore[union-attr]

    def payloads(self) -> list[bytes]:
        return [p for _, p, _ in self.got]


async def _fence(pub: Any, inbox: Inbox, topic: str = "fence") -> None:
    """Publish a marker the subscriber of ``inbox`` receives and wait for it: everything
    published before it has been delivered (per-publisher order) or never will be."""
    marker = f"{len(inbox.got)}-{id(inbox)}".encode()
    assert await pub.publish(topic, marker)
    await until(lambda: (topic, marker, False) in inbox.got, f"fence on {topic}")
    inbox.got.remove((topic, marker, False))


# -- topic filters ------------------------------------------------------------------------
_CASES = [
    ("a/b", "a/b"),
    ("a/+", "a/b"),
    ("a/+", "a/b/c"),
    ("a/+", "a/"),
    ("a/#", "a"),
    ("a/#", "a/b/c"),
    ("#", "a/b"),
    ("+/+", "a/b"),
    ("+", "a/b"),
    ("a/+/c", "a/b/c"),
    ("a/+/c", "a/b/d"),
    ("a/b", "a/b/c"),
    ("+/b/#", "x/b"),
    ("/+", "/a"),
    ("+", "/a"),
]


@pytest.mark.parametrize(("filter_", "topic"), _CASES)
def test_matches_agrees_with_aiomqtt(filter_: str, topic: str) -> None:
    assert matches(filter_, topic) == aiomqtt.Topic(topic).matches(filter_)


def test_wildcards_at_the_first_level_skip_dollar_topics() -> None:
    assert not matches("#", "$SYS/x") and not matches("+/x", "$SYS/x")
    assert matches("$SYS/#", "$SYS/x") and matches("$SYS/+", "$SYS/x")


# -- the same scenarios on Mosquitto and in memory -----------------------------------------
async def test_wildcards_deliver_one_copy_per_client_live_unretained(env: Env) -> None:
    inbox = Inbox()
    sub = env.make(
        client_id="sub",
        subscriptions=["a/#", "a/+", "#", "$x/#", "x/+/z"],
        handler=inbox,
    )
    async with env.make(client_id="pub") as pub, sub:
        await pub.wait_connected(10)
        await sub.wait_connected(10)
        for topic in ["a/b", "a", "b/c", "$x/y", "$y", "x/y/z", "x//z", "x/y/w"]:
            assert await pub.publish(topic, topic.encode())
        await _fence(pub, inbox)
    assert inbox.got == [
        (t, t.encode(), False) for t in ["a/b", "a", "b/c", "$x/y", "x/y/z", "x//z", "x/y/w"]
    ]
    assert inbox.tasks == {"bus:sub"}  # the subscriber's own session task, never the publisher


async def test_retained_on_subscribe_per_filter_and_empty_payload_deletes(env: Env) -> None:
    async with env.make(client_id="pub") as pub:
        await pub.wait_connected(10)
        for topic in ["a/1", "a/2", "b/1"]:
            assert await pub.publish(topic, b"r-" + topic.encode(), retain=True)
        order: list[str] = []
        inbox = Inbox()

        async def on_connect() -> None:
            await asyncio.sleep(0.05)
            order.append("on_connect")

        async def handler(msg: BusMessage) -> None:
            order.append(msg.topic)
            await inbox(msg)

        # only this client's own filters; each SUBSCRIBE sends its retained messages, so the
        # overlapping filter gets them twice; none is handled before on_connect returns
        sub = env.make(
            client_id="sub", subscriptions=["a/+", "a/#"], handler=handler, on_connect=on_connect
        )
        async with sub:
            await until(lambda: len(inbox.got) == 4, "retained messages")
            assert order[0] == "on_connect"
            assert sorted(inbox.got) == sorted(
                [(t, b"r-" + t.encode(), True) for t in ["a/1", "a/2"]] * 2
            )
            inbox.got.clear()
            # live: retain flag cleared; an empty retained payload reaches subscribers
            assert await pub.publish("a/1", b"live", retain=True)
            assert await pub.publish("a/1", b"", retain=True)
            await _fence(pub, inbox, "a/fence")
            assert inbox.got == [("a/1", b"live", False), ("a/1", b"", False)]
        later = Inbox()
        async with env.make(client_id="later", subscriptions=["a/+"], handler=later) as sub2:
            await sub2.wait_connected(10)
            await _fence(pub, later, "a/fence")
        assert later.got == [("a/2", b"r-a/2", True)]  # a/1 was deleted


async def test_in_order_delivery_per_publisher(env: Env) -> None:
    inbox = Inbox()
    async with (
        env.make(client_id="p1") as p1,
        env.make(client_id="p2") as p2,
        env.make(client_id="sub", subscriptions=["o/+"], handler=inbox) as sub,
    ):
        for b in (p1, p2, sub):
            await b.wait_connected(10)

        async def burst(pub: Any, name: str) -> None:
            for i in range(300):
                assert await pub.publish(
                    f"o/{name}{i % 3}", f"{name}{i}".encode(), retain=bool(i % 2)
                )

        await asyncio.gather(burst(p1, "a"), burst(p2, "b"))
        await until(lambda: len(inbox.got) == 600, "600 messages")
    for name in "ab":
        mine = [p.decode() for t, p, _ in inbox.got if t.startswith(f"o/{name}")]
        assert mine == [f"{name}{i}" for i in range(300)]
    assert not any(r for _, _, r in inbox.got)


async def test_broker_outage_drops_reconnects_resubscribes_and_loses_retained(env: Env) -> None:
    inbox = Inbox()
    calls = {"pub": 0, "sub": 0}

    def counting(name: str) -> Callable[[], Any]:
        async def on_connect() -> None:
            calls[name] += 1

        return on_connect

    async with (
        env.make(client_id="pub", on_connect=counting("pub")) as pub,
        env.make(
            client_id="sub", subscriptions=["t/#"], handler=inbox, on_connect=counting("sub")
        ) as sub,
    ):
        await pub.wait_connected(10)
        await sub.wait_connected(10)
        assert await pub.publish("t/kept", b"before", retain=True)
        await _fence(pub, inbox, "t/fence")
        env.stop()
        try:
            await until(lambda: not pub.connected.is_set(), "publisher sees the outage")
            await until(lambda: not sub.connected.is_set(), "subscriber sees the outage")
            assert await pub.publish("t/lost", b"lost") is False
            await asyncio.sleep(0.3)  # both keep retrying against the stopped broker
            assert (pub.connects, sub.connects) == (1, 1)
        finally:
            env.start()
        await until(lambda: pub.connects == 2 and sub.connects == 2, "both reconnect")
        assert calls == {"pub": 2, "sub": 2}
        await _fence(pub, inbox, "t/fence")  # the subscription was renewed
    assert inbox.got == [("t/kept", b"before", False)]  # no replay, no retained, no "lost"


async def test_clean_session_queues_nothing_for_a_disconnected_client(env: Env) -> None:
    inbox = Inbox()
    async with (
        env.make(client_id="pub") as pub,
        env.make(
            client_id="sub",
            subscriptions=["q/#"],
            handler=inbox,
            reconnect_min_s=0.5,
            reconnect_max_s=0.5,
        ) as sub,
    ):
        await pub.wait_connected(10)
        await sub.wait_connected(10)
        env.kill(sub)
        await until(lambda: not sub.connected.is_set(), "subscriber cut off")
        assert await pub.publish("q/missed", b"missed", qos=1)
        assert sub.connects == 1  # published while the subscriber was away
        await until(lambda: sub.connects == 2, "subscriber back")
        await _fence(pub, inbox, "q/fence")
    assert inbox.got == []


async def test_will_on_a_cut_connection_not_on_a_clean_close(env: Env) -> None:
    inbox = Inbox()
    will = Will("w/victim", b"offline")
    watcher = env.make(client_id="watcher", subscriptions=["w/#"], handler=inbox)
    victim = env.make(client_id="victim", will=will, reconnect_min_s=0.3, reconnect_max_s=0.3)
    async with watcher, victim:
        await watcher.wait_connected(10)
        await victim.wait_connected(10)
        assert await victim.publish("w/victim", b"online", retain=True)
        await until(lambda: inbox.got == [("w/victim", b"online", False)], "online")
        env.kill(victim)
        await until(lambda: inbox.got[-1] == ("w/victim", b"offline", False), "the will")
        await until(lambda: victim.connects == 2, "victim reconnects by itself")
        assert await victim.publish("w/victim", b"online", retain=True)
        await until(lambda: inbox.got[-1] == ("w/victim", b"online", False), "online again")
        await victim.close()  # clean DISCONNECT: no will
        await _fence(watcher, inbox, "w/fence")
        late = Inbox()
        async with env.make(client_id="late", subscriptions=["w/victim"], handler=late):
            await until(lambda: late.got, "retained status")
    assert late.got == [("w/victim", b"online", True)]
    assert inbox.got[-1] == ("w/victim", b"online", False)


async def test_same_client_id_takes_over_and_the_old_will_is_sent(env: Env) -> None:
    inbox = Inbox()
    async with env.make(client_id="watcher", subscriptions=["w/#"], handler=inbox) as watcher:
        await watcher.wait_connected(10)
        old = env.make(
            client_id="dup", will=Will("w/dup", b"old-gone"), reconnect_min_s=30, reconnect_max_s=30
        )
        async with old:
            await old.wait_connected(10)
            async with env.make(client_id="dup") as new:
                await new.wait_connected(10)
                await until(lambda: not old.connected.is_set(), "old session dropped")
                await until(lambda: ("w/dup", b"old-gone", False) in inbox.got, "old will")
                assert new.connected.is_set() and old.connects == 1
                assert await new.publish("w/new", b"x")
                assert await old.publish("w/old", b"x") is False
                await _fence(watcher, inbox, "w/fence")
        late = Inbox()  # the will was stored retained
        async with env.make(client_id="late", subscriptions=["w/dup"], handler=late):
            await until(lambda: late.got, "retained will")
    assert inbox.got == [("w/dup", b"old-gone", False), ("w/new", b"x", False)]
    assert late.got == [("w/dup", b"old-gone", True)]


async def test_invalid_topics_and_filters_raise_value_error(env: Env) -> None:
    async with env.make(client_id="pub") as pub:
        await pub.wait_connected(10)
        for topic in ["a/+", "a/#", ""]:
            with pytest.raises(ValueError):
                await pub.publish(topic, b"x")
    for bad in ["a/#/b", "a+", ""]:
        bus = env.make(client_id="bad", subscriptions=[bad])
        with pytest.raises(ValueError):
            await asyncio.wait_for(bus.run(), 5)
        assert bus.connects == 0


# -- memory only ----------------------------------------------------------------------------
async def test_thousands_of_sessions_fan_out_through_the_exact_index() -> None:
    broker = MemoryBroker()
    n = 2000
    inboxes = [Inbox() for _ in range(n)]
    service = Inbox()
    buses = [
        MemoryBus(broker=broker, client_id=f"a{i}", subscriptions=[f"plans/h{i}"], handler=box)
        for i, box in enumerate(inboxes)
    ]
    buses.append(
        MemoryBus(broker=broker, client_id="svc", subscriptions=["hosts/#"], handler=service)
    )
    tasks = [asyncio.create_task(b.run()) for b in buses]
    try:
        await until(lambda: all(b.connected.is_set() for b in buses), "all connected")
        for i in range(n):
            assert await buses[-1].publish(f"plans/h{i}", b"p%d" % i, retain=True)
            assert await buses[i].publish(f"hosts/h{i}/ack", b"a%d" % i, retain=True)
        await until(lambda: all(box.got for box in inboxes), "every plan delivered")
        await until(lambda: len(service.got) == n, "every ack delivered")
        assert [box.got for box in inboxes] == [
            [(f"plans/h{i}", b"p%d" % i, False)] for i in range(n)
        ]
        stats = broker.stats()
        assert stats["sessions"] == n + 1 and stats["wildcard_filters"] == 1
        assert stats["published"] == 2 * n and stats["delivered"] == 2 * n
        assert stats["retained"] == 2 * n
        broker.stop()  # no wills, retained store gone, everyone disconnected
        assert broker.stats()["retained"] == 0 and broker.clients == []
        await until(lambda: not any(b.connected.is_set() for b in buses), "all dropped")
        assert broker.wills == 0
        await until(lambda: broker.refused >= n + 1, "connects refused while stopped")
        broker.start()
        await until(lambda: all(b.connects == 2 for b in buses), "all reconnect", timeout=20)
        assert len(broker.clients) == n + 1
        broker.kill_client("nobody")  # not connected: a no-op
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert broker.clients == []  # cancelled run() = clean close


# -- the fleet simulator on the memory bus ---------------------------------------------------
async def test_simulated_fleet_on_the_memory_bus(tmp_path: Path) -> None:
    broker = MemoryBroker()
    fabric = generate_rail_optimized(hosts=8, rails=4)
    hosts = [h.host for h in fabric.hosts]
    acks: dict[str, int] = {}  # host -> acks seen by an observer since the last reset

    async def observe(msg: BusMessage) -> None:
        parsed = topics.parse(msg.topic)
        if parsed is not None and parsed.kind == "ack":
            acks[parsed.host] = acks.get(parsed.host, 0) + 1

    bus = BusSettings(reconnect_min_s=0.05, reconnect_max_s=0.2)
    damping = DampingPolicy(hold_down_initial_s=0.5)
    observer = broker.bus_factory(
        **bus.connection(),
        client_id="observer",
        subscriptions=[topics.all_host_topics()],
        handler=observe,
    )
    async with (
        SimulatedFleet(
            fabric,
            bus=bus,
            workdir=tmp_path,
            damping=damping,
            debounce_ms=50,
            bus_factory=broker.bus_factory,
        ) as fleet,
        observer,
    ):
        await fleet.wait_all_acked()
        assert set(acks) == set(hosts)  # every host acked its first plan
        epoch0 = fleet.service.state.epoch

        fleet.link_down("gpu003", 2)
        await wait_until(lambda: fleet.service.state.epoch > epoch0, 10, "a new solve")
        affected = {h for h, p in fleet.service.state.plans.items() if p.epoch > epoch0}
        assert "gpu003" in affected
        await fleet.wait_all_acked()
        plans = fleet.service.state.plans
        for h in affected:  # the victim and its peers applied the plan for rail 2 down
            assert fleet.agents[h].applier.applied_epoch == plans[h].epoch > epoch0
        assert fleet.service.state.unusable() == {"gpu003": frozenset({2})}

        clients = len(broker.clients)
        broker.stop()
        await wait_until(
            lambda: not any(a.bus.connected.is_set() for a in fleet.agents.values()),
            10,
            "every agent to see the outage",
        )
        acks.clear()
        broker.start()
        await wait_until(lambda: len(broker.clients) == clients, 20, "every session back")
        assert all(a.bus.connects == 2 for a in fleet.agents.values())
        # on reconnect each agent re-announces and re-publishes its last ack
        await wait_until(lambda: set(acks) == set(hosts), 10, "acks again after the outage")
        epoch1 = fleet.service.state.epoch
        fleet.link_up("gpu003", 2)  # the system still works end to end after the outage
        await wait_until(lambda: fleet.service.state.unusable() == {}, 20, "re-admission")
        await fleet.wait_all_acked(epoch1 + 1)
    assert broker.clients == []
