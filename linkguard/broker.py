"""Embedded MQTT broker (amqtt) for single-machine runs: zero setup, bound to 127.0.0.1.

amqtt listens on 0.0.0.0 by default; linkguard never does unless told to. Production uses
Mosquitto (see deploy/ and the README).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["embedded_broker", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@asynccontextmanager
async def embedded_broker(*, host: str = "127.0.0.1", port: int = 1883) -> AsyncIterator[int]:
    """Run an amqtt broker for the lifetime of the context; yields the port it listens on
    (``port=0`` picks a free one)."""
    from amqtt.broker import Broker

    if port == 0:
        port = free_port(host)
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}},
        "plugins": {
            "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
        },
    }
    broker = Broker(config)
    await broker.start()
    try:
        yield port
    finally:
        await broker.shutdown()
