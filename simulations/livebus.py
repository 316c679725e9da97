"""The bus of a real-time replay (:mod:`linkguard.simulations.live`): the broker it runs on
and the operator client that publishes the switch-level faults.

Consumes: a bus kind (``mosquitto``: a private Mosquitto,
:class:`~linkguard.broker.MosquittoProcess`, on a free port under a work dir; ``memory``: the
in-memory broker of :mod:`linkguard.membus`). Produces: a :class:`LiveBroker` (bus settings and
a bus factory for the fleet, and the outages: stop, start on the same port, sever one client's
connection as a crash does) and a :class:`FaultsOperator` (publishes the faults in force
retained on ``fabric/faults``, as ``linkguard fabric faults`` does).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from linkguard import topics
from linkguard.bus import Bus, BusSession
from linkguard.config import BusSettings
from linkguard.models import FabricFaults, encode

__all__ = ["BUSES", "BusKind", "FaultsOperator", "LiveBroker", "open_broker"]

BusKind = Literal["mosquitto", "memory"]
#: The buses a live replay can run on.
BUSES: tuple[str, ...] = ("mosquitto", "memory")


# --------------------------------------------------------------------------------------------
# Brokers


class LiveBroker(Protocol):
    """A broker a live replay runs on: settings and a bus factory for the fleet, outages."""

    bus_factory: Callable[..., BusSession]
    settings: BusSettings

    def down(self) -> None: ...
    def up(self) -> None: ...
    def sever(self, bus: BusSession, client_id: str) -> None: ...
    def close(self) -> None: ...


def _bus_settings(**kw: object) -> BusSettings:
    # reconnect quickly after an outage (production's default backoff reaches 10 s)
    return BusSettings.model_validate({"reconnect_min_s": 0.05, "reconnect_max_s": 1.0, **kw})


class _Mosquitto:
    def __init__(self, workdir: Path) -> None:
        from linkguard.broker import MosquittoProcess  # lazy: amqtt/mosquitto per backend

        self.proc = MosquittoProcess(workdir).start()
        self.settings = _bus_settings(port=self.proc.port)
        self.bus_factory: Callable[..., BusSession] = Bus

    def down(self) -> None:
        self.proc.stop()

    def up(self) -> None:
        self.proc.start()

    def sever(self, bus: BusSession, client_id: str) -> None:
        """Cut ``bus``'s TCP connection without an MQTT DISCONNECT (a crashed process: the
        broker publishes its last will). Reaches into aiomqtt/paho for the socket; when there
        is none (not connected) nothing is needed."""
        sock = getattr(getattr(getattr(bus, "_client", None), "_client", None), "socket", None)
        s = sock() if callable(sock) else None
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.proc.stop()


class _Memory:
    def __init__(self) -> None:
        from linkguard.membus import MemoryBroker  # lazy: loaded only for this backend

        self.broker = MemoryBroker()
        self.settings = _bus_settings()
        self.bus_factory: Callable[..., BusSession] = self.broker.bus_factory

    def down(self) -> None:
        self.broker.stop()

    def up(self) -> None:
        self.broker.start()

    def sever(self, bus: BusSession, client_id: str) -> None:
        self.broker.kill_client(client_id)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.stop()


def open_broker(kind: BusKind, workdir: Path) -> LiveBroker:
    """Start a broker of ``kind`` (Mosquitto's files under ``workdir/broker``). Raises
    FileNotFoundError when ``mosquitto`` and no mosquitto binary exists, ImportError for
    ``memory`` without :mod:`linkguard.membus`, ValueError for an unknown kind."""
    if kind == "mosquitto":
        return _Mosquitto(workdir / "broker")
    if kind == "memory":
        return _Memory()
    raise ValueError(f"unknown bus {kind!r}; one of {', '.join(BUSES)}")


# --------------------------------------------------------------------------------------------
# The operator: publishes the switch-level faults, as `linkguard fabric faults` does


class FaultsOperator:
    """The operator's client: publishes ``faults()`` (the set in force, None: nothing yet)."""

    def __init__(self, broker: LiveBroker, faults: Callable[[], FabricFaults | None]) -> None:
        self._faults = faults
        self.pending = False
        self.bus = broker.bus_factory(
            **broker.settings.connection(),
            client_id=f"linkguard-sim-operator-{time.monotonic_ns()}",
            on_connect=self._on_connect,
        )

    async def _on_connect(self) -> None:
        if self.pending:
            await self.publish()

    async def publish(self) -> None:
        """Publish the faults in force (retained); kept pending while disconnected (an
        operator would retry) and published on the next connection."""
        faults = self._faults()
        if faults is not None:
            self.pending = not await self.bus.publish(
                topics.fabric_faults(), encode(faults), retain=True
            )
