"""The bus session's lifetime (linkguard/buslife.py), one implementation for the MQTT bus and
the in-memory one: the wiring modules read ``async for message in bus.messages()``; a session
lost is reconnected, resubscribed and announced again; leaving the loop ends the session
cleanly (no last will), on a real Mosquitto as in memory."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from linkguard.bus import Bus, BusMessage, Will
from linkguard.buslife import BusLife
from linkguard.membus import MemoryBroker, MemoryBus
from tests.support import until


def test_both_buses_share_one_lifetime() -> None:
    for cls in (Bus, MemoryBus):
        assert issubclass(cls, BusLife)
        for name in ("messages", "run", "close", "__aenter__", "__aexit__", "_delay"):
            assert getattr(cls, name) is getattr(BusLife, name), (cls, name)


async def _read(bus: BusLife, got: list[BusMessage], until_n: int) -> None:
    """``async for message in bus.messages()`` until ``until_n`` messages arrived."""
    async with contextlib.aclosing(bus.messages()) as messages:
        async for message in messages:
            got.append(message)
            if len(got) == until_n:
                return


async def test_messages_survive_a_lost_session_and_leaving_sends_no_will() -> None:
    broker = MemoryBroker()
    connects: list[int] = []
    reader = MemoryBus(
        broker=broker,
        client_id="reader",
        subscriptions=["t/#"],
        will=Will("t/reader/status", b"lost"),
        reconnect_min_s=0.01,
        reconnect_max_s=0.05,
    )

    async def announce() -> None:
        connects.append(reader.connects)

    reader._on_connect = announce
    got: list[BusMessage] = []
    async with MemoryBus(broker=broker, client_id="writer") as writer:
        await writer.wait_connected(5)
        task = asyncio.create_task(_read(reader, got, 3))
        await reader.wait_connected(5)
        assert await writer.publish("t/a", b"1", retain=True)
        await until(lambda: len(got) == 1, "the first message")
        broker.kill_client("reader")  # its will is sent: a cut, not a clean close
        await until(lambda: connects == [1, 2], "reconnected and announced again")
        assert broker.retained["t/reader/status"] == b"lost"
        await asyncio.wait_for(task, 5)
        # the second session's SUBSCRIBE brought the retained messages back (its own will
        # among them), in the broker's order
        assert [(m.topic, m.payload, m.retain) for m in got] == [
            ("t/a", b"1", False),
            ("t/a", b"1", True),
            ("t/reader/status", b"lost", True),
        ]
    # leaving the loop ended the session: disconnected, and cleanly (no will this time)
    assert not reader.connected.is_set()
    assert "reader" not in broker.clients
    assert broker.wills == 1


@pytest.mark.real
async def test_leaving_messages_disconnects_cleanly_from_mosquitto(mosquitto) -> None:
    will = Will("t/reader/status", b"lost")
    reader = Bus(
        host="127.0.0.1",
        port=mosquitto.port,
        client_id="reader",
        subscriptions=["t/data"],
        will=will,
    )
    got: list[BusMessage] = []
    seen: list[BusMessage] = []

    async def watch(msg: BusMessage) -> None:
        seen.append(msg)

    async with (
        Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id="watcher",
            subscriptions=["t/reader/status"],
            handler=watch,
        ) as watcher,
        Bus(host="127.0.0.1", port=mosquitto.port, client_id="writer") as writer,
    ):
        await watcher.wait_connected(10)
        await writer.wait_connected(10)
        task = asyncio.create_task(_read(reader, got, 1))
        await reader.wait_connected(10)
        assert await writer.publish("t/data", b"x")
        await asyncio.wait_for(task, 10)
        assert [(m.topic, m.payload) for m in got] == [("t/data", b"x")]
        assert not reader.connected.is_set() and reader.connects == 1
        # a clean DISCONNECT: the broker does not send the will (checked after a round trip)
        assert await writer.publish("t/reader/status", b"probe")
        await until(lambda: seen, "the watcher's round trip")
        assert [m.payload for m in seen] == [b"probe"]
