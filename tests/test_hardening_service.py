"""Issue 21 (hardening, bounded shutdown): the topology service against a broker that is late
and hosts that misbehave, on the real service over a real Mosquitto.

* the start-up settle counts from the first connect: with the broker away for longer than
  ``startup_settle_s``, the first plans still wait ``startup_settle_s`` after the connect, and
  they are computed with the retained states that were waiting on the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from structlog.testing import capture_logs

from linkguard import topics
from linkguard.broker import free_port
from linkguard.bus import Bus, BusMessage
from linkguard.config import BusSettings, HostBudgetSettings, ServiceSettings
from linkguard.metrics import ServiceMetrics
from linkguard.models import HostStatus, PortState, PortStatus, encode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until

FABRIC = generate_rail_optimized(hosts=4, rails=2)
HOST = FABRIC.hosts[0].host


def _down_state() -> PortState:
    return PortState(
        host=HOST,
        hca="mlx5_0",
        port=1,
        rail=0,
        status=PortStatus.DOWN,
        usable=False,
        observed_at=time.time(),
        seq=1,
    )


@contextlib.asynccontextmanager
async def _forwarder(listen_port: int, to_port: int) -> AsyncIterator[None]:
    """A TCP forwarder 127.0.0.1:``listen_port`` -> 127.0.0.1:``to_port``: the broker
    "comes back" on the service's port the moment it opens, with its retained messages."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", to_port)
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    try:
        yield
    finally:
        server.close()


async def test_the_startup_settle_counts_from_the_first_connect(mosquitto) -> None:
    settle_s, away_s = 1.0, 1.5
    async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="gpu-agent") as agent:
        await agent.wait_connected(10)
        key = (HOST, "mlx5_0/1")
        await agent.publish(
            topics.port_state(HOST, "mlx5_0", 1), encode(_down_state()), retain=True
        )
    port = free_port()  # nothing listens there yet: the broker is away
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.1),
            startup_settle_s=settle_s,
        ),
        fabric=FABRIC,
    )
    task = asyncio.create_task(service.run())
    try:
        t0 = time.monotonic()
        await until(lambda: time.monotonic() - t0 >= away_s, "the broker's absence", 5)
        assert service.bus.connects == 0 and not service.state.published
        async with _forwarder(port, mosquitto.port):
            await until(lambda: service.bus.connects == 1, "the first connect")
            t_connect = time.monotonic()
            await until(lambda: service.state.published, "the first plans")
            t_plans = time.monotonic()
            # the settle waited from the connect, and the first solve had the retained state
            assert t_plans - t_connect >= settle_s - 0.05, t_plans - t_connect
            assert service.state.ports[key].status == PortStatus.DOWN
            assignments = service.state.plans[HOST].rail_assignments
            assert assignments and all(a.rail != 0 for a in assignments)  # off the down rail
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)


async def test_a_flooding_host_is_held_to_its_budget_before_decoding(mosquitto) -> None:
    """A host publishing big junk, too many messages and too many retained topics: what
    exceeds its budget is dropped unread (counted by reason, logged once), the rest decoded as
    usual, and another host's message right behind the flood is taken."""
    budget = HostBudgetSettings(
        messages_per_s=20,
        messages_burst=100,
        bytes_per_s=65536,
        bytes_burst=262144,
        retained_topics=32,
    )
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05),
            startup_settle_s=0,
            host_budget=budget,
        ),
        fabric=FABRIC,
    )
    other = FABRIC.hosts[1].host
    task = asyncio.create_task(service.run())
    try:
        async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="flooder") as flood:
            await flood.wait_connected(10)
            await service.bus.wait_connected(10)
            with capture_logs() as logs:
                big = b"x" * 100_000
                for _ in range(20):  # 2 MB of junk: 2 fit the 256 KiB burst
                    await flood.publish(topics.events(HOST), big)
                for i in range(100):  # retained junk under 100 topics: 32 fit
                    await flood.publish(
                        topics.port_state(HOST, f"mlx5_{i + 10}", 1), b"j", retain=True
                    )
                for _ in range(300):  # small junk, far over 20/s
                    await flood.publish(topics.events(HOST), b"{}")
                # behind the flood, on the same connection (in order): another host's status
                status = HostStatus(host=other, online=True)
                await flood.publish(topics.status(other), encode(status), retain=True)
                await until(lambda: service.state.online.get(other) is True, "the other host")
        dropped = service.budget_dropped
        assert dropped["bytes"] >= 17
        assert dropped["retained_topics"] >= 60
        assert dropped["messages"] >= 200
        # decoded (and refused as junk) only what fit the budget: the 2 big ones, 32 retained,
        # the few small ones the bucket still held or refilled
        assert sum(service.dropped.values()) <= 20 + 32 + 100 + 2
        assert sum(service.dropped.values()) + sum(dropped.values()) == 420
        lines = [e for e in logs if e["event"] == "host_budget_exceeded"]
        assert [(e["host"], e["reason"]) for e in lines] == [(HOST, "bytes")]  # once a minute
        body, _ = ServiceMetrics(service).render()
        text = body.decode()
        for reason in ("bytes", "messages", "retained_topics"):
            line = f'linkguard_host_budget_dropped_total{{reason="{reason}"}} {dropped[reason]}.0'
            assert line in text
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)


async def test_retained_messages_of_hosts_that_left_the_fabric_are_removed(mosquitto) -> None:
    """gpu099 left the fabric (its agent stopped: status offline) and gpu098 was never in it
    but runs (status online): the service deletes everything gpu099 left retained, keeps
    gpu098's (the audit reports it) and every fabric host's."""
    gone, stranger = "gpu099", "gpu098"
    retained = {
        topics.status(gone): encode(HostStatus(host=gone, online=False, reason="stopped")),
        topics.inventory(gone): b'{"junk": "an old inventory"}',
        topics.port_state(gone, "mlx5_0", 1): b'{"old": "state"}',
        topics.ack(gone): b'{"old": "ack"}',
        topics.probe_report(gone): b'{"old": "report"}',
        topics.status(stranger): encode(HostStatus(host=stranger, online=True)),
        topics.status(HOST): encode(HostStatus(host=HOST, online=True)),
        topics.port_state(HOST, "mlx5_0", 1): encode(_down_state()),
    }
    async with Bus(host="127.0.0.1", port=mosquitto.port, client_id="old-agents") as old:
        await old.wait_connected(10)
        for topic, payload in retained.items():
            assert await old.publish(topic, payload, retain=True)
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05), startup_settle_s=0.2
        ),
        fabric=FABRIC,
    )
    task = asyncio.create_task(service.run())
    try:
        with capture_logs() as logs:
            await until(
                lambda: any(e["event"] == "stale_host_cleared" for e in logs), "the clearing"
            )
        cleared = [(e["host"], e["topics"]) for e in logs if e["event"] == "stale_host_cleared"]
        assert cleared == [(gone, 5)]
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)
    # a fresh reader: what is retained now (the control, HOST's status, comes with the rest)
    got: dict[str, bytes] = {}

    async def keep(m: BusMessage) -> None:
        got[m.topic] = m.payload

    async with Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="reader",
        subscriptions=[f"linkguard/v1/hosts/{gone}/#", topics.all_host_topics()],
        handler=keep,
    ):
        await until(lambda: topics.status(stranger) in got, "the retained messages")
        await until(lambda: topics.port_state(HOST, "mlx5_0", 1) in got, "HOST's state")
    assert not [t for t in got if f"/{gone}/" in t]
    assert got[topics.status(stranger)] == retained[topics.status(stranger)]
    assert topics.status(HOST) in got
