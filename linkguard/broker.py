"""Embedded MQTT broker (amqtt) for single-machine runs: zero setup, bound to 127.0.0.1.

amqtt listens on 0.0.0.0 by default; linkguard never does unless told to. Production uses
Mosquitto (see deploy/ and the README).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["embedded_broker", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _broker_class() -> type:
    from amqtt.broker import Broker

    class LoopbackBroker(Broker):
        """amqtt's broker with one fix: on connect, amqtt 0.11/0.12 sends a client the retained
        messages matching *every* client's subscriptions (broker.py, right after
        ``handler.start()``), so agents would receive each other's plans. Serve a client only
        the retained messages of filters it subscribed to itself."""

        async def _publish_retained_messages_for_subscription(self, subscription, session):  # type: ignore[no-untyped-def]
            subscribers = self._subscriptions.get(subscription[0], ())
            if any(s is session for s, _ in subscribers):
                await super()._publish_retained_messages_for_subscription(subscription, session)

    return LoopbackBroker


@asynccontextmanager
async def embedded_broker(*, host: str = "127.0.0.1", port: int = 1883) -> AsyncIterator[int]:
    """Run an amqtt broker for the lifetime of the context; yields the port it listens on
    (``port=0`` picks a free one)."""
    from amqtt.errors import BrokerError

    # amqtt logs every connection at INFO and queued messages at shutdown at WARNING: neither
    # is news to the operator of a single-machine trial.
    logging.getLogger("amqtt").setLevel(logging.ERROR)

    if port == 0:
        port = free_port(host)
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}},
        "plugins": {
            "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
        },
    }
    broker = _broker_class()(config)
    try:
        await broker.start()
    except BrokerError as exc:  # amqtt wraps bind errors (address in use, unknown host)
        raise OSError(f"embedded broker cannot listen on {host}:{port}: {exc}") from None
    try:
        yield port
    finally:
        await broker.shutdown()
