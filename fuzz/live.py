"""A live fleet to fuzz the bus message handlers: the real topology service and two real agents
(simulated ports, in-memory route tables) on an in-memory broker, run by a private event loop.

Consumes: (topic, payload) pairs (:meth:`LiveFleet.deliver`). Produces: nothing, or an
exception when a handler raised (the exception itself), a process stopped, or a payload that
does not decode on a topic the service or an agent reads was not counted as dropped.

The fleet is a :class:`~linkguard.simulations.fleet.SimulatedFleet` (what ``linkguard sim run
--bus memory`` runs), by default in the production setting of :mod:`linkguard.signing`: the
service signs its plans with a key made for the fleet and the agents require signatures.
:meth:`LiveFleet.deliver` can seal a payload with that key (``seal=True``: what a service that
signs a malformed plan would send), so damaged plans and peer routes reach the agents'
decoders and appliers, not only the signature check. Its bus sessions are wrapped: each
handler is timed by a probe (a message every session reads, taken out before the handler), so
:meth:`LiveFleet.deliver` returns once every session has handled everything published before
it, and an exception a handler raises is kept (and re-raised by ``deliver``) instead of ending
that process.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from linkguard import topics
from linkguard.bus import BusMessage
from linkguard.config import BusSettings
from linkguard.membus import MemoryBroker
from linkguard.models import BadMessage, decode
from linkguard.settings.servicesections import HostBudgetSettings
from linkguard.signing import SignatureError, Signer, generate_keys, unwrap
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.topology.fabric import generate_rail_optimized

__all__ = ["TOPIC_MODELS", "LiveFleet", "live_fleet"]

#: the fleet's hosts: gpu000 and gpu001, 2 rails each
FABRIC = generate_rail_optimized(hosts=2, rails=2)
H0, H1 = (h.host for h in FABRIC.hosts)
STRANGER = "gpu999"  # a host the fabric does not list
#: probes go to this topic, which every session reads (the agents through ``peers/+``)
_PROBE_TOPIC = topics.peer_routes("fuzz-probe")

#: topic -> the kind of message on it (:func:`fuzz.targets.decoder_models`)
TOPIC_MODELS: dict[str, str] = {
    topics.plan(H0): "plan",
    topics.plan(H1): "plan",
    topics.plan(STRANGER): "plan",
    topics.peer_routes(H0): "peers",
    topics.peer_routes(H1): "peers",
    topics.peer_routes(STRANGER): "peers",
    topics.port_state(H0, "mlx5_0", 1): "port",
    topics.port_state(H0, "mlx5_1", 1): "port",
    topics.port_state(H1, "mlx5_0", 1): "port",
    topics.port_state(STRANGER, "mlx5_0", 1): "port",
    topics.ack(H0): "ack",
    topics.ack(STRANGER): "ack",
    topics.inventory(H0): "inventory",
    topics.events(H0): "events",
    topics.status(H0): "status",
    topics.status(STRANGER): "status",
    topics.service_status(): "service_status",
    topics.fabric_faults(): "fabric_faults",
    topics.service_health(): "",
}
#: valid messages on these are real orders (another instance of a host or of the service
#: makes the later one stop): only undecodable payloads are delivered there
_JUNK_ONLY = {topics.status(H0), topics.status(STRANGER), topics.service_status()}


class LiveFleet:
    """``LiveFleet()`` starts the fleet (first plans acked); :meth:`deliver` a message;
    :meth:`close` stops everything and removes the state directories."""

    def __init__(self, *, signed: bool = True, timeout: float = 20.0) -> None:
        from fuzz.targets import decoder_models

        self.timeout = timeout
        self.models = decoder_models()
        #: the topics :func:`fuzz.targets.bus` picks from
        self.topics = list(TOPIC_MODELS)
        self.errors: list[tuple[str, BusMessage, BaseException]] = []
        self.probed: dict[str, int] = {}
        self.delivered = 0
        self._probe = 0
        self._probe_seen = asyncio.Event()
        self._token = os.urandom(16)
        self._workdir = Path(tempfile.mkdtemp(prefix="linkguard-fuzz-live-"))
        #: the service's key (None: unsigned fleet); seals payloads for deliver(seal=True)
        self.signer: Signer | None = None
        self._keys: tuple[Path, Path] | None = None
        if signed:
            self._keys = generate_keys(self._workdir / "keys")
            self.signer = Signer.from_file(self._keys[0])
        self._runner = asyncio.Runner()
        self._broker: MemoryBroker | None = None
        self._sender: Any = None
        self.fleet: SimulatedFleet | None = None
        try:
            self._runner.run(asyncio.wait_for(self._start(), timeout))
        except BaseException:
            self.close()
            raise

    # -- the wrapped message handlers ---------------------------------------------------------
    def _wrap_handlers(self, fleet: SimulatedFleet) -> None:
        """Each process's bus -> core step (``_on_message``, what its wiring calls for every
        message of ``bus.messages()``) through :meth:`_wrap`: probes answered, errors kept."""
        parts: dict[str, Any] = {"service": fleet.service, **fleet.agents}
        for name, part in parts.items():
            part._on_message = self._wrap(name, part._on_message)
            self.probed[name] = 0

    def _wrap(self, name: str, handler: Callable[[BusMessage], Any]) -> Callable[..., Any]:
        async def handle(msg: BusMessage) -> None:
            # a random token per fleet: no fuzz input can pass for a probe (hypothesis mines
            # the source for constants, and found a fixed prefix)
            if msg.topic == _PROBE_TOPIC and msg.payload[:16] == self._token:
                self.probed[name] = int(msg.payload[16:])
                self._probe_seen.set()
                return
            try:
                await handler(msg)
            except Exception as exc:  # kept for deliver(); the process carries on
                self.errors.append((name, msg, exc))

        return handle

    async def _start(self) -> None:
        self._broker = MemoryBroker()
        self.fleet = SimulatedFleet(
            FABRIC,
            bus=BusSettings(reconnect_min_s=0.05),
            workdir=self._workdir,
            debounce_ms=0,
            settle_s=0,
            bus_factory=self._broker.bus_factory,
            signing_key=self._keys[0] if self._keys else None,
            service_public_key=self._keys[1] if self._keys else None,
            # the fuzzer sends thousands of messages a second as a few hosts: under the
            # production budget most would be dropped before decoding, and the decoders and
            # handlers this target is for would go unfuzzed (the budget has its own tests)
            service_update={
                "host_budget": HostBudgetSettings(
                    messages_per_s=1e6,
                    messages_burst=10_000_000,
                    bytes_per_s=1e10,
                    bytes_burst=10**10,
                    retained_topics=1_000_000,
                )
            },
        )
        self._wrap_handlers(self.fleet)
        await self.fleet.__aenter__()
        self._sender = self._broker.bus_factory(client_id="fuzz-sender")
        await self._sender.__aenter__()
        await self._sender.wait_connected(self.timeout)
        await self.fleet.wait_all_acked(timeout=self.timeout)

    # -- public -------------------------------------------------------------------------------
    @property
    def components(self) -> list[str]:
        """``service`` and the agents' host names."""
        return list(self.probed)

    def drops(self) -> dict[str, int]:
        """Messages each component dropped or refused so far."""
        assert self.fleet is not None
        svc = self.fleet.service
        # a message over the host's budget is dropped before decoding, counted there
        out = {"service": sum(svc.dropped.values()) + sum(svc.budget_dropped.values())}
        for host, agent in self.fleet.agents.items():
            stats = agent.stats
            out[host] = sum(stats.messages_dropped.values()) + sum(stats.plans_refused.values())
        return out

    def refused(self, kind: str, payload: bytes, host: str | None) -> bool:
        """True when ``payload`` is not a message of ``kind`` for ``host``: it does not
        decode, or (plans and peer routes of a signed fleet) is not signed by the service."""
        if kind in ("plan", "peers") and self.signer is not None:
            try:
                payload = unwrap(payload, self.signer.verifier, require=True).body
            except SignatureError:
                return True
        try:
            decode(self.models[kind], payload, expect_host=host)
        except BadMessage:
            return True
        return False

    def must_count(self, topic: str, payload: bytes) -> set[str]:
        """The components that must count ``payload`` on ``topic`` as dropped when it is
        :meth:`refused`: an agent its own plan and every peer routes (non-empty), its own
        status; the service every host topic of a host in the fabric, ``service/status`` and
        ``fabric/faults``. Empty when it is a valid message (what happens then is the
        message's business)."""
        parsed = topics.parse(topic)
        kind = TOPIC_MODELS.get(topic) or (parsed.kind if parsed is not None else "")
        if parsed is None or kind not in self.models:
            return set()
        host = parsed.host or None
        if kind in ("plan", "peers") and not payload:
            return set()  # MQTT's deletion of a retained message
        if not self.refused(kind, payload, host):
            return set()
        agents = set(self.components) - {"service"}
        if kind == "plan":
            return {host} & agents
        if kind == "peers":
            return agents
        if kind in ("service_status", "fabric_faults"):
            return {"service"}
        out = {"service"} if host in agents else set()
        if kind == "status" and host in agents:
            out.add(host)
        return out

    def deliver(self, topic: str, payload: bytes, *, seal: bool = False) -> bool:
        """Publish ``payload`` on ``topic`` (``seal``: in an envelope signed by the service's
        key, when the fleet has one) and wait until every session handled it. False when it
        was not delivered (a valid message on a topic of :data:`_JUNK_ONLY`). Raises what a
        handler raised, or AssertionError when a process stopped or a drop was not counted."""
        if seal and self.signer is not None:  # an envelope's body is text (Signer.seal)
            payload = self.signer.seal(payload.decode("utf-8", "replace").encode())
        if topic in _JUNK_ONLY:
            model = self.models[TOPIC_MODELS[topic]]
            try:
                decode(model, payload)
                return False
            except BadMessage:
                pass
        expect = self.must_count(topic, payload)
        before = self.drops()
        try:
            self._runner.run(asyncio.wait_for(self._deliver(topic, payload), self.timeout))
        except TimeoutError:
            late = sorted(c for c, n in self.probed.items() if n < self._probe)
            assert self.fleet is not None
            tasks = {t.get_name(): t for t in self.fleet._tasks}
            raise AssertionError(
                f"{late} did not handle the message on {topic} within {self.timeout} s; "
                f"tasks done: {[(n, t.exception()) for n, t in tasks.items() if t.done()]}, "
                f"sessions: {self._broker.clients if self._broker else None}"
            ) from None
        if self.errors:
            _, _, exc = self.errors[0]
            self.errors.clear()
            raise exc
        self.check_running()
        after = self.drops()
        missed = sorted(c for c in expect if after[c] <= before[c])
        assert not missed, f"{missed} did not count an undecodable message on {topic}"
        self.delivered += 1
        return True

    async def _deliver(self, topic: str, payload: bytes) -> None:
        await self._sender.publish(topic, payload)
        self._probe += 1
        n = self._probe
        await self._sender.publish(_PROBE_TOPIC, self._token + str(n).encode())
        while any(v < n for v in self.probed.values()):
            await self._probe_seen.wait()
            self._probe_seen.clear()

    def run_until(self, cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
        """Run the fleet until ``cond()`` is true; TimeoutError naming ``what`` after
        ``timeout`` seconds."""

        async def wait() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not cond():
                if loop.time() > deadline:
                    raise TimeoutError(f"no {what} within {timeout} s")
                await asyncio.sleep(0.01)

        self._runner.run(wait())

    def check_running(self) -> None:
        """AssertionError unless the service and every agent still run."""
        assert self.fleet is not None
        stopped = [t.get_name() for t in self.fleet._tasks if t.done()]
        assert not stopped, f"stopped: {stopped}"

    def close(self) -> None:
        async def stop() -> None:
            if self._sender is not None:
                await self._sender.close()
            if self.fleet is not None:
                await self.fleet.__aexit__(None, None, None)

        try:
            self._runner.run(asyncio.wait_for(stop(), self.timeout))
        finally:
            self._runner.close()
            shutil.rmtree(self._workdir, ignore_errors=True)


@functools.cache
def live_fleet() -> LiveFleet:
    """The process's :class:`LiveFleet`, stopped at exit."""
    fleet = LiveFleet()
    atexit.register(fleet.close)
    return fleet
