"""The fleet audit the running service keeps retained on ``service/audit``: published once at
start (before any agent reported), hosts count as reported only while their agent is online
(a clean stop and a last will alike), agents of hosts the fabric lacks are ``unknown_host``.
Real Mosquitto, service and agents in-process; one agent is a real MQTT client killed with
SIGKILL, so that the broker publishes its last will."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import pytest

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusMessage
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import HostStatus, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import require_binary, retained, until

SERVICE_FABRIC = generate_rail_optimized(hosts=3, rails=2)  # gpu000..gpu002
AGENTS_FABRIC = generate_rail_optimized(hosts=4, rails=2)  # and gpu003, unknown to the service


def _bus(port: int) -> BusSettings:
    return BusSettings(port=port, reconnect_min_s=0.05)


def _service(port: int) -> TopologyService:
    settings = ServiceSettings(bus=_bus(port), solve={"short_ms": 0}, startup_settle_s=0)
    return TopologyService(settings, fabric=SERVICE_FABRIC)


def _agent(host: str, port: int, workdir: Path) -> Agent:
    settings = agent_settings_for(
        AGENTS_FABRIC, host, bus=_bus(port), workdir=workdir, damping=DampingPolicy()
    )
    ports = [active_port(h.hca, h.port) for h in AGENTS_FABRIC.host(host).hcas]
    return Agent(
        settings, source=SimulatedPortSource(ports), table=MemoryRouteTable(), discovered=[]
    )


def _kinds(doc: dict) -> list[tuple[str, str]]:
    return [(f["kind"], f["subject"]) for f in doc["findings"]]


@pytest.mark.real
async def test_a_fresh_service_publishes_its_audit(mosquitto) -> None:
    """No agent ever reported: the audit (every host missing) is there to read at once."""
    service = _service(mosquitto.port)
    task = asyncio.create_task(service.run())
    try:
        doc = json.loads(await retained(mosquitto.port, topics.service_audit(), timeout=5))
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)
    assert _kinds(doc) == [("missing_host", h) for h in ("gpu000", "gpu001", "gpu002")]
    assert (doc["errors"], doc["warnings"]) == (3, 0)


@pytest.mark.real
async def test_the_audit_follows_the_agents_online(mosquitto, tmp_path: Path) -> None:
    port = mosquitto.port
    docs: list[dict] = []

    async def on_audit(msg: BusMessage) -> None:
        docs.append(json.loads(msg.payload))

    async def audit_is(*want: tuple[str, str], what: str) -> None:
        await until(lambda: docs and _kinds(docs[-1]) == list(want), what)

    # gpu000's "agent": an MQTT client that announces gpu000 online and dies without a word;
    # its last will (status offline, retained) is what a crashed agent leaves
    offline = encode(HostStatus(host="gpu000", online=False, at=1.0, instance="dead"))
    argv = [require_binary("mosquitto_sub"), "-h", "127.0.0.1", "-p", str(port), "-q", "1"]
    argv += ["-i", "doomed-agent", "-t", "linkguard-test/none", "--will-topic"]
    argv += [topics.status("gpu000"), "--will-payload", offline.decode()]
    doomed = subprocess.Popen(
        [*argv, "--will-retain", "--will-qos", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    service = _service(port)
    agents = {h: _agent(h, port, tmp_path) for h in ("gpu001", "gpu002", "gpu003")}
    tasks = [asyncio.create_task(service.run())]
    try:
        async with Bus(
            host="127.0.0.1",
            port=port,
            client_id="operator",
            subscriptions=[topics.service_audit()],
            handler=on_audit,
        ) as operator:
            await operator.wait_connected(10)
            await audit_is(*[("missing_host", h.host) for h in SERVICE_FABRIC.hosts], what="start")
            await until(lambda: doomed.poll() is None and service.bus.connected.is_set(), "up")
            online = HostStatus(host="gpu000", online=True, at=2.0, instance="dead")
            await operator.publish(topics.status("gpu000"), encode(online), retain=True)
            inventory = encode(AGENTS_FABRIC.host("gpu000"))
            await operator.publish(topics.inventory("gpu000"), inventory, retain=True)
            tasks += [asyncio.create_task(a.run()) for a in agents.values()]
            # every fabric host online; gpu003's agent is reported, the fabric lacks it
            await audit_is(("unknown_host", "gpu003"), what="all online, one stranger")
            unknown = docs[-1]["findings"][0]
            assert unknown["severity"] == "warning" and unknown["observed"] == "reported"

            agents["gpu001"].stop()  # a clean stop: status offline
            await audit_is(
                ("missing_host", "gpu001"), ("unknown_host", "gpu003"), what="gpu001 stopped"
            )
            doomed.send_signal(signal.SIGKILL)  # the broker publishes the last will
            await audit_is(
                ("missing_host", "gpu000"),
                ("missing_host", "gpu001"),
                ("unknown_host", "gpu003"),
                what="gpu000's last will",
            )
            agents["gpu003"].stop()
            await audit_is(
                ("missing_host", "gpu000"), ("missing_host", "gpu001"), what="the stranger gone"
            )
            assert service.dropped == {}
            # what a fresh reader gets is the same, retained
            doc = json.loads(await retained(port, topics.service_audit()))
            assert doc == docs[-1]
    finally:
        doomed.kill()
        doomed.wait(5)
        for a in agents.values():
            a.stop()
        service.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
