"""The chaos proxy (:mod:`linkguard.simulations.chaosproxy`) between real MQTT clients and a
real Mosquitto: drop, duplicate, reorder and delay PUBLISH packets per direction and topic,
cut connections (the broker's last will fires), the same faults for the same seed."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiomqtt
import pytest

from linkguard.simulations.chaosproxy import (
    ChaosProxy,
    Rule,
    matches,
    parse_rule,
    publish_payload,
)
from tests.support import until

pytestmark = pytest.mark.real


def _client(port: int, name: str, **kw: object) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, identifier=f"{name}-{time.monotonic_ns()}", **kw)


async def _collect(client: aiomqtt.Client, got: list[tuple[str, bytes]]) -> None:
    async for m in client.messages:
        got.append((str(m.topic), bytes(m.payload)))  # type: ignore[arg-type]


async def _publish_through(
    broker: int, sub_port: int, pub_port: int, topics_payloads: list[tuple[str, bytes]], qos: int
) -> list[tuple[str, bytes]]:
    """Subscribe to ``t/#`` on ``sub_port``, publish ``topics_payloads`` on ``pub_port``, then a
    marker straight to the broker; what the subscriber got before the marker, in order."""
    got: list[tuple[str, bytes]] = []
    async with _client(sub_port, "sub") as sub:
        await sub.subscribe("t/#", qos=qos)
        reader = asyncio.ensure_future(_collect(sub, got))
        try:
            async with _client(pub_port, "pub") as pub:
                for topic, payload in topics_payloads:
                    await pub.publish(topic, payload, qos=qos)
            async with _client(broker, "marker") as marker:
                await marker.publish("t/end", b"end", qos=qos)
            await until(lambda: ("t/end", b"end") in got, "the marker")
        finally:
            reader.cancel()
    return [g for g in got if g[0] != "t/end"]


def test_topic_filters_and_rule_text() -> None:
    assert matches("linkguard/v1/plans/#", "linkguard/v1/plans/gpu000")
    assert matches("a/+/c", "a/b/c") and not matches("a/+/c", "a/b/d")
    assert not matches("a/b", "a/b/c") and matches("#", "x")
    rule = parse_rule("drop:down:linkguard/v1/plans/+:0.25:3")
    assert rule == Rule("drop", "down", "linkguard/v1/plans/+", 0.25, 3)
    with pytest.raises(ValueError, match="one of drop"):
        parse_rule("explode:down:#")
    with pytest.raises(ValueError, match="up, down or both"):
        parse_rule("drop:sideways:#")


async def test_drops_the_first_publish_to_a_client_on_a_topic(mosquitto) -> None:
    rules = [Rule("drop", "down", "t/plan/#", count=1)]
    async with ChaosProxy("127.0.0.1", mosquitto.port, rules, seed=1) as proxy:
        msgs = [("t/plan/a", b"1"), ("t/other", b"x"), ("t/plan/a", b"2")]
        got = await _publish_through(mosquitto.port, proxy.port, mosquitto.port, msgs, qos=0)
    assert got == [("t/other", b"x"), ("t/plan/a", b"2")]
    assert proxy.actions == [("down", "drop", "t/plan/a")]
    assert proxy.stats[("down", "drop")] == 1


async def test_duplicates_and_reorders_publishes_to_the_broker(mosquitto) -> None:
    rules = [
        Rule("duplicate", "up", "t/dup"),
        Rule("reorder", "up", "t/first", count=1),
    ]
    async with ChaosProxy("127.0.0.1", mosquitto.port, rules, seed=1) as proxy:
        msgs = [("t/first", b"1"), ("t/second", b"2"), ("t/dup", b"3")]
        got = await _publish_through(mosquitto.port, mosquitto.port, proxy.port, msgs, qos=0)
    # the held first one goes out right after the second; the third twice
    assert got == [("t/second", b"2"), ("t/first", b"1"), ("t/dup", b"3"), ("t/dup", b"3")]
    assert proxy.stats[("up", "duplicate")] == 1 and proxy.stats[("up", "reorder")] == 1


async def test_delays_a_publish_at_qos1(mosquitto) -> None:
    rules = [Rule("delay", "down", "t/slow", delay_s=0.3)]
    async with ChaosProxy("127.0.0.1", mosquitto.port, rules) as proxy:
        got: list[tuple[str, bytes]] = []
        arrived: dict[str, float] = {}
        async with _client(proxy.port, "sub") as sub:
            await sub.subscribe("t/#", qos=1)
            reader = asyncio.ensure_future(_collect(sub, got))
            try:
                async with _client(mosquitto.port, "pub") as pub:
                    t0 = time.monotonic()
                    await pub.publish("t/slow", b"s", qos=1)
                    await pub.publish("t/fast", b"f", qos=1)
                await until(lambda: len(got) == 2, "both messages")
                arrived["done"] = time.monotonic() - t0
            finally:
                reader.cancel()
    assert got == [("t/fast", b"f"), ("t/slow", b"s")]
    assert arrived["done"] >= 0.3


async def test_the_same_seed_drops_the_same_messages(mosquitto) -> None:
    msgs = [(f"t/m{i}", str(i).encode()) for i in range(40)]

    async def run(seed: int) -> list[tuple[str, bytes]]:
        rules = [Rule("drop", "up", "t/#", probability=0.5)]
        async with ChaosProxy("127.0.0.1", mosquitto.port, rules, seed=seed) as proxy:
            return await _publish_through(mosquitto.port, mosquitto.port, proxy.port, msgs, qos=0)

    first, again, other = await run(7), await run(7), await run(8)
    assert first == again
    assert 5 < len(first) < 35  # about half dropped
    assert other != first


async def test_cut_closes_the_connection_and_the_last_will_fires(mosquitto) -> None:
    will = aiomqtt.Will("t/will", b"gone", qos=1)
    got: list[tuple[str, bytes]] = []
    async with (
        ChaosProxy("127.0.0.1", mosquitto.port) as proxy,
        _client(mosquitto.port, "watcher") as watcher,
    ):
        await watcher.subscribe("t/will", qos=1)
        reader = asyncio.ensure_future(_collect(watcher, got))
        try:
            victim = _client(proxy.port, "victim", will=will)
            await victim.__aenter__()
            await until(lambda: proxy.connections == 1, "the victim connected")
            assert proxy.cut() == 1
            await until(lambda: ("t/will", b"gone") in got, "the last will")
            with pytest.raises(aiomqtt.MqttError):
                await victim.publish("t/after", b"x", qos=1, timeout=1)
            with contextlib.suppress(aiomqtt.MqttError):
                await victim.__aexit__(None, None, None)
        finally:
            reader.cancel()


async def test_a_cut_rule_cuts_the_connection_that_publishes(mosquitto) -> None:
    rules = [Rule("cut", "up", "t/boom")]
    async with (
        ChaosProxy("127.0.0.1", mosquitto.port, rules) as proxy,
        _client(proxy.port, "pub") as pub,
    ):
        await pub.publish("t/boom", b"x", qos=0)
        await until(lambda: proxy.connections == 0, "the connection cut")
    assert proxy.actions == [("up", "cut", "t/boom")]


async def test_the_tap_sees_every_publish_as_sent_dropped_or_not(mosquitto) -> None:
    """What a client sent, before any rule: the lab chaos run reads the agents' port events
    from it (their journal numbers and times), also the ones the proxy then drops."""
    seen: list[tuple[str, str | None, int, bytes]] = []
    rules = [Rule("drop", "up", "t/lost")]
    async with ChaosProxy("127.0.0.1", mosquitto.port, rules, seed=1) as proxy:
        proxy.tap = lambda d, p: seen.append((d, p.topic, p.qos, publish_payload(p)))
        msgs = [("t/lost", b"gone"), ("t/kept", b"x" * 300)]  # 300: a 2-byte remaining length
        got = await _publish_through(mosquitto.port, mosquitto.port, proxy.port, msgs, 0)
        assert got == [("t/kept", b"x" * 300)]
        # QoS 1 (a packet identifier before the payload); nothing dropped: a publisher that
        # waits for its PUBACK would wait for a dropped one until its timeout
        proxy.rules = []
        got = await _publish_through(mosquitto.port, mosquitto.port, proxy.port, msgs, 1)
        assert got == msgs
    assert seen == [
        ("up", "t/lost", 0, b"gone"),
        ("up", "t/kept", 0, b"x" * 300),
        ("up", "t/lost", 1, b"gone"),
        ("up", "t/kept", 1, b"x" * 300),
    ]
