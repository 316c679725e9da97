"""The MQTT bus adapter: the only module that imports the MQTT client (aiomqtt 2.x).

Consumes: a broker address and the topics to subscribe to. Produces: decoded-later raw
messages to a handler, and publishes (QoS 1). Uses MQTT 3.1.1 only, so Mosquitto and the
embedded amqtt broker both work. The connection is kept by :meth:`Bus.run`: on any error it
waits a jittered exponential backoff (min..max, full jitter) and reconnects, resubscribes and
calls ``on_connect`` (which re-publishes current state, so a broker outage never replays stale
state).
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiomqtt
import structlog

__all__ = ["Bus", "BusMessage", "Will"]

log = structlog.get_logger(__name__)

#: QoS 1 messages in flight to the broker at once (paho's default is 20); Mosquitto's
#: ``max_inflight_messages 0`` in deploy/mosquitto.conf lifts the broker's side.
MAX_INFLIGHT = 256
#: aiomqtt logs a warning above this many publish calls awaiting their acknowledgement.
PENDING_CALLS_WARN = 4096
#: Disable Nagle's algorithm: without it a plan (or an ack) written right after the PUBACK of
#: an incoming message waits for the broker's delayed ACK of that PUBACK, ~40 ms on Linux
#: (measured on the namespace lab: plans reached agents 32-35 ms after the service sent them).
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


@dataclass(frozen=True)
class BusMessage:
    topic: str
    payload: bytes
    retain: bool


@dataclass(frozen=True)
class Will:
    """Last will: published retained by the broker when this client vanishes."""

    topic: str
    payload: bytes


Handler = Callable[[BusMessage], Awaitable[None]]


def _reraise_lost_cancel() -> None:
    """Raise CancelledError when the current task is being cancelled but got here anyway.

    On Python 3.11, ``asyncio.wait_for`` (used inside aiomqtt's publish) can swallow a
    cancellation that arrives as the awaited operation completes (CPython gh-86296, fixed in
    3.12): the task then carries on and waits forever in its next await, and SIGTERM never
    stops the daemon. Checked after every await into aiomqtt."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Bus:
    """One MQTT session that reconnects by itself.

    ``async with Bus(...) as bus`` starts the connection task; ``publish`` returns False (and
    drops the message) while disconnected: callers re-publish their current state from
    ``on_connect``. Raises nothing on broker failures; they are logged and retried.
    ``subscriptions``: topic filters, subscribed at QoS 1, or (filter, QoS) pairs.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        client_id: str,
        subscriptions: Sequence[str | tuple[str, int]] = (),
        handler: Handler | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive_s: int = 15,
        reconnect_min_s: float = 0.2,
        reconnect_max_s: float = 10.0,
        timeout_s: float = 10.0,
    ) -> None:
        self._host = host
        self._port = port
        self._client_id = client_id
        self._subscriptions = list(subscriptions)
        self._handler = handler
        self._on_connect = on_connect
        self._will = will
        self._username = username
        self._password = password
        self._keepalive = keepalive_s
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._timeout = timeout_s
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.connects = 0

    async def __aenter__(self) -> Bus:
        self._task = asyncio.create_task(self.run(), name=f"bus:{self._client_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def wait_connected(self, timeout: float) -> None:
        await asyncio.wait_for(self.connected.wait(), timeout)

    async def publish(
        self, topic: str, payload: bytes, *, retain: bool = False, qos: int = 1
    ) -> bool:
        """Publish (QoS 1 unless told). False when not connected or the publish failed."""
        client = self._client
        if client is None or not self.connected.is_set():
            log.debug("bus_publish_dropped_disconnected", topic=topic)
            return False
        try:
            await client.publish(topic, payload, qos=qos, retain=retain)
        except aiomqtt.MqttError as exc:
            _reraise_lost_cancel()
            log.warning(
                "bus_publish_failed",
                topic=topic,
                error=str(exc),
                broker=f"{self._host}:{self._port}",
            )
            return False
        _reraise_lost_cancel()
        return True

    async def run(self) -> None:
        """Connect, subscribe, dispatch; reconnect forever with jittered backoff."""
        attempt = 0
        while True:
            will = (
                aiomqtt.Will(self._will.topic, self._will.payload, qos=1, retain=True)
                if self._will
                else None
            )
            try:
                async with aiomqtt.Client(
                    self._host,
                    self._port,
                    identifier=self._client_id,
                    username=self._username,
                    password=self._password,
                    protocol=aiomqtt.ProtocolVersion.V311,
                    clean_session=True,
                    keepalive=self._keepalive,
                    will=will,
                    timeout=self._timeout,
                    max_inflight_messages=MAX_INFLIGHT,
                    socket_options=NO_DELAY,
                ) as client:
                    # the service publishes a plan per changed host at once (hundreds of QoS 1
                    # calls awaiting their PUBACKs): expected, not worth aiomqtt's warning at 10
                    client.pending_calls_threshold = PENDING_CALLS_WARN
                    self._client = client
                    for sub in self._subscriptions:
                        topic, qos = (sub, 1) if isinstance(sub, str) else sub
                        await client.subscribe(topic, qos=qos)
                    self.connected.set()
                    self.connects += 1
                    attempt = 0
                    log.info(
                        "bus_connected",
                        broker=f"{self._host}:{self._port}",
                        client_id=self._client_id,
                        connects=self.connects,
                    )
                    if self._on_connect is not None:
                        await self._on_connect()
                    async for message in client.messages:
                        if self._handler is None:
                            continue
                        payload = message.payload
                        if isinstance(payload, str):
                            payload = payload.encode()
                        elif not isinstance(payload, bytes | bytearray):
                            payload = b"" if payload is None else str(payload).encode()
                        await self._handler(
                            BusMessage(str(message.topic), bytes(payload), bool(message.retain))
                        )
                        _reraise_lost_cancel()
            except aiomqtt.MqttError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # aiomqtt's __aexit__ can turn our cancellation into an MqttError (its
                    # disconnect timed out): we are stopping, not reconnecting.
                    raise asyncio.CancelledError from exc
                attempt += 1
                lo, hi = self._backoff
                delay = random.uniform(lo, min(hi, lo * 2**attempt))
                log.warning(
                    "bus_disconnected",
                    broker=f"{self._host}:{self._port}",
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                    attempt=attempt,
                )
            finally:
                self._client = None
                self.connected.clear()
            await asyncio.sleep(delay)
