"""The bus adapter against real brokers: reconnect after a broker restart (resubscribe, state
re-published from on_connect), the last will on a vanished client, failover to the next broker
of a list when the one connected to dies (two private Mosquittos), subscriptions a broker
refuses (SUBACK 0x80) retried until granted (amqtt with a topic plugin that refuses), and the
embedded amqtt broker speaking the same MQTT 3.1.1."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from amqtt.broker import Broker as AmqttBroker
from amqtt.contexts import Action
from amqtt.plugins.base import BaseTopicPlugin
from pydantic import ValidationError
from structlog.testing import capture_logs

from linkguard.broker import embedded_broker, free_port
from linkguard.bus import Bus, BusConnectTimeout, BusMessage
from linkguard.config import BusSettings
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


# -- failover: a list of brokers ---------------------------------------------------------------


@pytest.mark.real
async def test_fails_over_to_the_next_broker_when_the_first_dies(tmp_path: Path) -> None:
    first, second = start_mosquitto(tmp_path / "a"), start_mosquitto(tmp_path / "b")
    brokers = [("127.0.0.1", first.port), ("127.0.0.1", second.port)]
    got: list[BusMessage] = []
    state = {"value": b"up"}
    buses: dict[str, Bus] = {}

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    async def republish() -> None:  # the agent's on_connect: its current state, retained
        await buses["pub"].publish("t/state", state["value"], retain=True)

    fast = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.3}
    try:
        with capture_logs() as logs:
            async with (
                Bus(brokers=brokers, client_id="pub", on_connect=republish, **fast) as pub,
                Bus(
                    brokers=brokers, client_id="sub", subscriptions=["t/#"], handler=handler, **fast
                ) as sub,
            ):
                buses["pub"] = pub
                await until(lambda: [m.payload for m in got] == [b"up"], "first state")
                assert pub.broker == sub.broker == f"127.0.0.1:{first.port}"
                first.process.kill()  # SIGKILL: no goodbye, the sockets just close
                first.process.wait(5)
                state["value"] = b"down"
                await until(
                    lambda: pub.connects == 2 and sub.connects == 2, "both on the second broker"
                )
                assert pub.broker == sub.broker == f"127.0.0.1:{second.port}"
                assert pub.failovers >= 1 and sub.failovers >= 1
                # resubscribed on the second broker: the state re-published there arrives...
                await until(lambda: got[-1].payload == b"down", "state re-published after failover")
                # ...and live messages flow
                assert await pub.publish("t/live", b"after failover")
                await until(lambda: got[-1].topic == "t/live", "a live message after failover")
    finally:
        for broker in (first, second):
            broker.handle.stop()
    connected = [(e["client_id"], e["broker"]) for e in logs if e["event"] == "bus_connected"]
    assert sorted(connected) == sorted(
        [(c, f"127.0.0.1:{p}") for c in ("pub", "sub") for p in (first.port, second.port)]
    )
    lost = [e for e in logs if e["event"] == "bus_disconnected"]
    assert {e["next_broker"] for e in lost} >= {f"127.0.0.1:{second.port}"}


_FAILOVER_CLIENT = """
import asyncio, sys
from linkguard.bus import Bus, Will
async def main():
    buses = []
    async def online():
        await buses[0].publish("t/victim/status", b"online", retain=True)
        print("online", buses[0].broker, flush=True)
    brokers = [("127.0.0.1", int(p)) for p in sys.argv[1:]]
    async with Bus(brokers=brokers, client_id="victim", on_connect=online,
                   will=Will("t/victim/status", b"offline"), keepalive_s=5,
                   reconnect_min_s=0.05, reconnect_max_s=0.3) as b:
        buses.append(b)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.mark.real
async def test_the_last_will_goes_with_the_failed_over_connection(tmp_path: Path) -> None:
    """The will is set again on each connection: after failing over to the second broker, a
    client that vanishes is marked offline there."""
    first, second = start_mosquitto(tmp_path / "a"), start_mosquitto(tmp_path / "b")
    got: list[bytes] = []

    async def handler(msg: BusMessage) -> None:
        got.append(msg.payload)

    proc = subprocess.Popen(
        [sys.executable, "-c", _FAILOVER_CLIENT, str(first.port), str(second.port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # structlog's default output shares stdout
            if line.startswith("online"):
                assert line.split()[1] == f"127.0.0.1:{first.port}"
                break
        first.process.kill()
        for line in proc.stdout:
            if line.startswith("online"):
                assert line.split()[1] == f"127.0.0.1:{second.port}"
                break
        async with Bus(
            host="127.0.0.1",
            port=second.port,
            client_id="watcher",
            subscriptions=["t/victim/status"],
            handler=handler,
        ) as w:
            await w.wait_connected(10)
            await until(lambda: got == [b"online"], "online on the second broker")
            proc.kill()  # SIGKILL: the second broker must send the will
            await until(lambda: got[-1:] == [b"offline"], "last will", timeout=15)
    finally:
        proc.kill()
        proc.wait(5)
        for broker in (first, second):
            broker.handle.stop()


def test_bus_settings_broker_list() -> None:
    assert BusSettings().connection()["brokers"] == [("127.0.0.1", 1883)]
    assert BusSettings(port=1884).broker_addresses() == [("127.0.0.1", 1884)]
    s = BusSettings(brokers=["nats1.mgmt:1883", "10.0.0.2:1883", "[fd00::3]:1883"])
    assert s.connection()["brokers"] == [
        ("nats1.mgmt", 1883),
        ("10.0.0.2", 1883),
        ("fd00::3", 1883),
    ]
    assert (s.connection()["host"], s.connection()["port"]) == ("nats1.mgmt", 1883)
    assert BusSettings(brokers="a:1,b:2").brokers == ["a:1", "b:2"]  # type: ignore[arg-type]
    bad = {
        "n1": "expected host:port",
        "n1:0": "port 0 outside 1..65535",
        "n1:65536": "outside 1..65535",
        "a b:1": "expected host:port",
        "fd00::3:1883": "expected host:port",  # IPv6 needs brackets
    }
    for entry, why in bad.items():
        with pytest.raises(ValidationError, match=why):
            BusSettings(brokers=[entry])
    with pytest.raises(ValidationError, match="listed twice"):
        BusSettings(brokers=["a:1", "a:1"])
    with pytest.raises(ValidationError, match="not both"):
        BusSettings(brokers=["a:1"], host="b")
    with pytest.raises(ValueError, match="host and port, or brokers"):
        Bus(client_id="x")
    with pytest.raises(ValueError, match="bad broker address"):
        Bus(client_id="x", brokers=[("h", 0)])
    assert BusSettings().connection()["subscribe_qos"] == 1
    assert BusSettings(subscribe_qos=0).connection()["subscribe_qos"] == 0
    with pytest.raises(ValidationError, match="subscribe_qos"):
        BusSettings(subscribe_qos=2)
    with pytest.raises(ValueError, match="0 or 1"):
        Bus(client_id="x", host="h", port=1, subscribe_qos=2)


# -- refused subscriptions (SUBACK 0x80) -------------------------------------------------------


class RefuseSubscriptions(BaseTopicPlugin):
    """amqtt topic plugin: refuses the next ``refusals[filter]`` SUBSCRIBEs of a filter (what a
    broker ACL or a NATS node without JetStream leaders answers), then grants them."""

    refusals: ClassVar[dict[str, int]] = {}

    @dataclass
    class Config:
        pass

    async def topic_filtering(
        self, *, session: object = None, topic: str | None = None, action: Action | None = None
    ) -> bool:
        if action == Action.SUBSCRIBE and self.refusals.get(topic or "", 0) > 0:
            self.refusals[topic or ""] -= 1
            return False
        return True


@asynccontextmanager
async def _refusing_broker(refusals: dict[str, int]) -> AsyncIterator[int]:
    logging.getLogger("amqtt").setLevel(logging.ERROR)
    RefuseSubscriptions.refusals = refusals
    port = free_port()
    broker = AmqttBroker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
                f"{__name__}.RefuseSubscriptions": {},
            },
        }
    )
    await broker.start()
    try:
        yield port
    finally:
        await broker.shutdown()


async def test_a_refused_subscription_is_retried_until_granted() -> None:
    got: list[BusMessage] = []

    async def handler(msg: BusMessage) -> None:
        got.append(msg)

    async with _refusing_broker({"plans/a": 2}) as port:
        with capture_logs() as logs:
            async with (
                Bus(
                    host="127.0.0.1",
                    port=port,
                    client_id="agent",
                    subscriptions=["plans/a", "shared"],
                    handler=handler,
                    reconnect_min_s=0.05,
                    reconnect_max_s=0.2,
                ) as bus,
                Bus(host="127.0.0.1", port=port, client_id="service") as service,
            ):
                await bus.wait_connected(10)
                await service.wait_connected(10)
                # connected means listening: both filters granted, in the first session
                assert (bus.connects, bus.subscriptions_refused) == (1, 2)
                assert bus.refused_subscriptions == []
                assert await service.publish("plans/a", b"plan")
                assert await service.publish("shared", b"health")
                await until(lambda: len(got) == 2, "both topics delivered")
    assert sorted(m.topic for m in got) == ["plans/a", "shared"]
    refused = [e for e in logs if e["event"] == "bus_subscription_refused"]
    assert [(e["log_level"], e["topics"], e["tries"]) for e in refused] == [
        ("warning", ["plans/a"], 1),
        ("warning", ["plans/a"], 2),
    ]


async def test_a_subscription_refused_for_good_is_never_connected_but_deaf() -> None:
    async with _refusing_broker({"plans/a": 10**6}) as port:
        with capture_logs() as logs:
            async with Bus(
                host="127.0.0.1",
                port=port,
                client_id="agent",
                subscriptions=["plans/a"],
                reconnect_min_s=0.05,
                reconnect_max_s=0.1,
                timeout_s=0.5,
            ) as bus:
                with pytest.raises(BusConnectTimeout, match="subscription refused") as caught:
                    await bus.wait_connected(2)
                await until(
                    lambda: any(e.get("then") == "reconnecting" for e in logs), "a reconnect"
                )
                assert bus.connects == 0 and not bus.connected.is_set()
                assert bus.refused_subscriptions == ["plans/a"]
                assert bus.subscriptions_refused >= 2
    assert "JetStream" in (caught.value.hint or "")
    assert caught.value.refused is False  # a broker outage-like state: keep retrying
