"""The bus adapter against real brokers: reconnect after a broker restart (resubscribe, state
re-published from on_connect), the last will on a vanished client, and the embedded amqtt
broker speaking the same MQTT 3.1.1."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from linkguard.broker import embedded_broker
from linkguard.bus import Bus, BusMessage
from tests.conftest import start_mosquitto
from tests.support import until


def _restart(broker, tmp: Path):
    """Stop Mosquitto and start a new one with the same config (same port)."""
    broker.process.terminate()
    broker.process.wait(5)
    return start_mosquitto(tmp, port=broker.port)


@pytest.mark.real
async def test_reconnects_resubscribes_and_republishes_after_broker_restart(
    mosquitto, tmp_path: Path
) -> None:
    got: list[BusMessage] = []
    state = {"value": b"up"}

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    buses: dict[str, Bus] = {}

    async def republish() -> None:  # what the agent does: current state, not a replay
        await buses["pub"].publish("t/state", state["value"], retain=True)

    async with (
        Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id="pub",
            on_connect=republish,
            reconnect_min_s=0.05,
            reconnect_max_s=0.3,
        ) as publisher,
        Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id="sub",
            subscriptions=["t/#"],
            handler=handler,
            reconnect_min_s=0.05,
            reconnect_max_s=0.3,
        ) as sub,
    ):
        buses["pub"] = publisher
        await until(lambda: [m.payload for m in got] == [b"up"], "first state")
        broker = _restart(mosquitto, tmp_path)  # persistence off: retained state is gone
        try:
            await until(lambda: not publisher.connected.is_set(), "disconnect seen")
            state["value"] = b"down"  # changed while the broker was away
            assert await publisher.publish("t/state", b"lost") is False
            await until(lambda: publisher.connects == 2 and sub.connects == 2, "reconnect")
            await until(lambda: got[-1].payload == b"down", "current state after reconnect")
            assert b"lost" not in [m.payload for m in got]
            # the subscription was renewed: live messages flow again
            await publisher.publish("t/other", b"x")
            await until(lambda: got[-1].topic == "t/other", "message after resubscribe")
        finally:
            broker.process.terminate()
            broker.process.wait(5)


_VANISHING_CLIENT = """
import asyncio, sys
from linkguard.bus import Bus, Will
async def main():
    async with Bus(host="127.0.0.1", port=int(sys.argv[1]), client_id="victim",
                   will=Will("t/victim/status", b"offline"), keepalive_s=5) as b:
        await b.wait_connected(10)
        await b.publish("t/victim/status", b"online", retain=True)
        print("ready", flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.mark.real
async def test_last_will_marks_a_killed_client_offline(mosquitto) -> None:
    got: list[BusMessage] = []

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    proc = subprocess.Popen(
        [sys.executable, "-c", _VANISHING_CLIENT, str(mosquitto.port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:  # structlog's default output shares stdout
            if line.strip() == "ready":
                break
        async with Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id="watcher",
            subscriptions=["t/victim/status"],
            handler=handler,
        ) as w:
            await w.wait_connected(10)
            await until(lambda: got and got[-1].payload == b"online", "online")
            proc.kill()  # SIGKILL: no DISCONNECT packet, the broker must send the will
            await until(lambda: got[-1].payload == b"offline", "last will", timeout=15)
    finally:
        proc.kill()
        proc.wait(5)


async def test_embedded_broker_retained_qos1_round_trip() -> None:
    got: list[BusMessage] = []

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    async with embedded_broker(port=0) as port:
        async with Bus(host="127.0.0.1", port=port, client_id="a") as a:
            await a.wait_connected(10)
            assert await a.publish("linkguard/v1/plans/h", b"plan-1", retain=True)
        # a subscriber arriving later still gets the retained message, flagged retained
        async with Bus(
            host="127.0.0.1",
            port=port,
            client_id="b",
            subscriptions=["linkguard/v1/plans/+"],
            handler=handler,
        ) as b:
            await b.wait_connected(10)
            await until(lambda: got, "retained plan")
    assert (got[0].topic, got[0].payload, got[0].retain) == (
        "linkguard/v1/plans/h",
        b"plan-1",
        True,
    )


async def test_embedded_broker_binds_loopback_only() -> None:
    async with embedded_broker(port=0) as port:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
    assert out.split()[3] == f"127.0.0.1:{port}", out  # the local address column of ss


async def test_embedded_broker_sends_retained_only_for_own_subscriptions() -> None:
    """amqtt 0.12 alone would hand a new client the retained messages of every other client's
    subscriptions (an agent would receive every host's plan)."""
    got: list[BusMessage] = []

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    async with (
        embedded_broker(port=0) as port,
        Bus(
            host="127.0.0.1", port=port, client_id="service", subscriptions=["linkguard/v1/plans/+"]
        ) as service,
    ):
        await service.wait_connected(10)
        await service.publish("linkguard/v1/plans/a", b"plan-a", retain=True)
        await service.publish("linkguard/v1/plans/b", b"plan-b", retain=True)
        async with Bus(
            host="127.0.0.1",
            port=port,
            client_id="agent-a",
            subscriptions=["linkguard/v1/plans/a"],
            handler=handler,
        ) as agent:
            await agent.wait_connected(10)
            await until(lambda: got, "own plan")
            await service.publish("linkguard/v1/plans/a", b"plan-a2")
            await until(lambda: len(got) == 2, "live plan")
    assert [m.payload for m in got] == [b"plan-a", b"plan-a2"]


@pytest.mark.real
async def test_close_finishes_while_the_broker_is_frozen(mosquitto) -> None:
    """Stopping the bus while the broker is frozen (SIGSTOP) with our socket's send buffer full:
    aiomqtt's disconnect cannot complete and times out with an MqttError, which must end the
    task, not turn the cancellation into a reconnect loop that never stops."""
    bus = Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="frozen",
        subscriptions=["t/#"],
        reconnect_min_s=0.05,
        reconnect_max_s=0.1,
        timeout_s=1.0,
    )
    await bus.__aenter__()
    await bus.wait_connected(10)
    mosquitto.process.send_signal(signal.SIGSTOP)
    try:
        for _ in range(64):  # QoS 0 MiBs until the socket buffers are full (a few MiB)
            if not await bus.publish("t/fill", b"x" * (1 << 20), qos=0):
                break
        await asyncio.wait_for(bus.close(), 20)
    finally:
        mosquitto.process.send_signal(signal.SIGCONT)
    assert not bus.connected.is_set()
