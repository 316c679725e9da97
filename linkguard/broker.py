"""Embedded MQTT broker (amqtt) for single-machine runs: zero setup, bound to 127.0.0.1.

amqtt listens on 0.0.0.0 by default; linkguard never does unless told to. Production uses
Mosquitto (see deploy/ and the README); :class:`MosquittoProcess` runs a private one for labs,
simulations and tests.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

__all__ = ["MosquittoProcess", "embedded_broker", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _broker_class() -> type:
    from amqtt.broker import Broker  # lazy: only the embedded broker needs amqtt

    class LoopbackBroker(Broker):
        """amqtt's broker with one fix: on connect, amqtt 0.11/0.12 sends a client the retained
        messages matching *every* client's subscriptions (broker.py, right after
        ``handler.start()``), so agents would receive each other's plans. Serve a client only
        the retained messages of filters it subscribed to itself."""

        async def _publish_retained_messages_for_subscription(self, subscription, session):
            subscribers = self._subscriptions.get(subscription[0], ())
            if any(s is session for s, _ in subscribers):
                await super()._publish_retained_messages_for_subscription(subscription, session)

    return LoopbackBroker


@asynccontextmanager
async def embedded_broker(*, host: str = "127.0.0.1", port: int = 1883) -> AsyncIterator[int]:
    """Run an amqtt broker for the lifetime of the context; yields the port it listens on
    (``port=0`` picks a free one)."""
    from amqtt.errors import BrokerError  # lazy: only the embedded broker needs amqtt

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


def _wait_listening(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"mosquitto did not listen on {host}:{port} within {timeout} s")


class MosquittoProcess:
    """A private Mosquitto on 127.0.0.1 for labs, simulations and tests.

    ``MosquittoProcess(workdir)`` writes ``workdir/mosquitto.conf`` (loopback listener,
    anonymous, no persistence, ``max_queued_messages 100000``, ``max_inflight_messages 0``:
    Mosquitto's default queue of 1000 silently drops QoS 1 messages under fan-in;
    ``set_tcp_nodelay true``: no Nagle delay on the broker's writes) and
    :meth:`start` runs it. :meth:`stop` then :meth:`start` again is a broker outage: the same
    port, retained messages lost (as a Mosquitto without persistence loses them).
    ``port=0`` picks a free port once, kept across restarts. ``config``: a whole
    mosquitto.conf to run instead (e.g. deploy/mosquitto/mosquitto.conf with its paths
    substituted); it must listen on 127.0.0.1:``port``. Raises FileNotFoundError when
    no ``mosquitto`` binary is found (PATH, then /usr/sbin) and TimeoutError when it does not
    listen within 10 s.
    """

    def __init__(
        self, workdir: Path, *, port: int = 0, binary: str | None = None, config: str | None = None
    ) -> None:
        found = binary or shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")
        if not found:
            raise FileNotFoundError("mosquitto not found (Debian package `mosquitto`)")
        self.binary = found
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.config = config

    def start(self) -> MosquittoProcess:
        """Start (or restart) the broker and wait until it listens; returns self."""
        if self.running:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            self.config
            if self.config is not None
            else f"listener {self.port} {self.host}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_queued_messages 100000\n"
            "max_inflight_messages 0\n"
            "set_tcp_nodelay true\n"
            f"log_dest file {self.log}\n"
            "log_type error\nlog_type warning\n"
        )
        self.process = subprocess.Popen(
            [self.binary, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(self.host, self.port, 10)
        except TimeoutError:
            self.stop()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s); a no-op when not running."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> MosquittoProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
