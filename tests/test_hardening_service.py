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

from linkguard import topics
from linkguard.broker import free_port
from linkguard.bus import Bus
from linkguard.config import BusSettings, ServiceSettings
from linkguard.models import PortState, PortStatus, encode
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
