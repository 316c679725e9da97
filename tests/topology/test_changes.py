"""The topology service's change feed: numbering, subscribers, stream queues, the backlog, and
the changes a real service emits for one link down and up (in-memory bus, real agents)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings
from linkguard.membus import MemoryBroker
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.generator import generate_rail_optimized


def test_changes_are_numbered_and_reach_every_subscriber() -> None:
    feed = ChangeFeed()
    seen: list[tuple[int, str]] = []
    stop = feed.subscribe(lambda c: seen.append((c.seq, c.kind)))
    feed.emit("host", {"host": "a", "online": True}, at=5.0)
    c = feed.emit("ack", {"host": "a", "epoch": 3})
    assert seen == [(1, "host"), (2, "ack")]
    assert c.to_dict()["data"] == {"host": "a", "epoch": 3}
    stop()
    feed.emit("host", {"host": "a", "online": False})
    assert len(seen) == 2  # unsubscribed
    assert feed.seq == 3


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown change kind 'bogus'"):
        ChangeFeed().emit("bogus", {})


def test_a_broken_subscriber_does_not_stop_the_others() -> None:
    feed = ChangeFeed()
    got: list[int] = []

    def broken(_c: object) -> None:
        raise RuntimeError("disk full")

    feed.subscribe(broken)
    feed.subscribe(lambda c: got.append(c.seq))
    feed.emit("audit", {})
    assert got == [1]


def test_a_slow_listener_gets_one_resync_and_then_the_new_changes() -> None:
    feed = ChangeFeed()
    with feed.listen(queue_size=3) as q:
        for i in range(6):
            feed.emit("ack", {"i": i})
        kinds = [q.get_nowait().kind for _ in range(q.qsize())]
        assert kinds == ["ack", "ack", "resync"]  # changes 3..6 lost, said once
        feed.emit("ack", {"i": 6})
        assert q.get_nowait().data == {"i": 6}
        assert feed.listeners == 1
    assert feed.listeners == 0


def test_since_serves_the_backlog_or_says_it_is_gone() -> None:
    feed = ChangeFeed(backlog=3)
    for i in range(5):
        feed.emit("ack", {"i": i})
    assert [c.seq for c in feed.since(3) or []] == [4, 5]
    assert feed.since(5) == []
    assert [c.seq for c in feed.since(2) or []] == [3, 4, 5]
    assert feed.since(1) is None  # change 2 already left the backlog


async def test_a_service_emits_what_a_link_down_changes(tmp_path: Path) -> None:
    fabric = generate_rail_optimized(hosts=4, rails=2)
    broker = MemoryBroker()
    async with SimulatedFleet(
        fabric,
        bus=BusSettings(),
        workdir=tmp_path,
        damping=DampingPolicy(hold_down_initial_s=0.2, hold_down_max_s=0.2),
        debounce_ms=20,
        bus_factory=broker.bus_factory,
    ) as fleet:
        await fleet.wait_all_acked()
        feed = fleet.service.changes
        assert {c.kind for c in feed.since(0) or []} >= {"host", "port", "plans", "ack"}
        mark = feed.seq
        fleet.link_down("gpu001", 1)
        epoch0 = fleet.service.state.epoch

        def after() -> list:
            return feed.since(mark) or []

        await wait_until(lambda: any(c.kind == "plans" for c in after()), 10, "a publish")
        await fleet.wait_all_acked(epoch0 + 1)
        changes = after()
        ports = [c.data for c in changes if c.kind == "port"]
        assert [(p["host"], p["hca"], p["status"]) for p in ports][:1] == [
            ("gpu001", "mlx5_1", "down")
        ]
        # an agent's start event (unknown -> up) may reach the service late: its journal
        # replays it once the service is online
        events = [
            c.data for c in changes if c.kind == "port_event" and c.data["previous"] != "unknown"
        ]
        assert [(e["host"], e["previous"], e["current"]) for e in events] == [
            ("gpu001", "up", "down")
        ]
        plans = next(c.data for c in changes if c.kind == "plans")
        assert plans["epoch"] > epoch0 and "gpu001" in plans["hosts"]
        acked = {c.data["host"] for c in changes if c.kind == "ack"}
        assert "gpu001" in acked
        # the agents' periodic re-publish of an unchanged state is not a change
        n_ports = len(ports)
        agent = fleet.agents["gpu002"]
        seen_seq = {k: st.seq for k, st in fleet.service.state.ports.items()}
        for st in agent.monitor.snapshot(wall=time.time()):
            await agent._publish_state(st)  # what _refresh does on its timer
        again = [k for k in seen_seq if k[0] == "gpu002"]
        await wait_until(
            lambda: all(fleet.service.state.ports[k].seq > seen_seq[k] for k in again),
            10,
            "the re-published states",
        )
        assert len([c for c in after() if c.kind == "port"]) == n_ports


def test_backlog_is_what_is_kept() -> None:
    feed = ChangeFeed(backlog=2)
    assert feed.backlog() == []
    for i in range(3):
        feed.emit("ack", {"i": i})
    assert [c.seq for c in feed.backlog()] == [2, 3]
