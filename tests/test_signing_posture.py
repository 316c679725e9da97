"""A signing mismatch between the service and its agents is never silent, both ways: a real
topology service (HTTP API on a free port) and real agents over a real Mosquitto.

- The agents require signed plans, the service does not sign: the agent drops every plan and
  says the service's key is missing; the service logs ``hosts_unprotected`` naming the host
  and the fix, its health check answers 503, the API and the metrics show the host
  unprotected.
- The service signs with a key an agent does not have: the same, the agent naming the key it
  does not know.
- Matched keys: healthy (200), nothing unprotected, every host acked.

The pure decision (:func:`linkguard.topology.posture.assess`) is checked on every case.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import ApiSettings, BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import HostStatus, SigningPosture, decode, encode
from linkguard.signing import Signer, generate_keys
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.posture import PostureDesk, assess
from linkguard.topology.service import TopologyService
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
A, B = (h.host for h in FABRIC.hosts)  # A: the host with the mismatch; B: a matched one


@dataclass
class Rig:
    service: TopologyService
    agents: dict[str, Agent]
    url: str
    logs: list[dict[str, Any]]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs if e.get("event") == name]


def _agent(host: str, port: int, workdir: Path, public_key: Path | None) -> Agent:
    settings = agent_settings_for(
        FABRIC,
        host,
        bus=BusSettings(port=port, reconnect_min_s=0.05),
        workdir=workdir,
        damping=DampingPolicy(),
    ).model_copy(update={"service_public_key": public_key})
    ports = [active_port(h.hca, h.port) for h in FABRIC.host(host).hcas]
    return Agent(
        settings, source=SimulatedPortSource(ports), table=MemoryRouteTable(), discovered=[]
    )


@contextlib.asynccontextmanager
async def _running(
    port: int, tmp: Path, *, signing_key: Path | None, public_keys: dict[str, Path | None]
) -> AsyncIterator[Rig]:
    settings = ServiceSettings(
        bus=BusSettings(port=port, reconnect_min_s=0.05),
        solve={"short_ms": 0},
        startup_settle_s=0,
        signing_key=signing_key,
        api=ApiSettings(enabled=True, port=0),
    )
    with capture_logs() as logs:
        service = TopologyService(settings, fabric=FABRIC)
        agents = {h: _agent(h, port, tmp / "agents", k) for h, k in public_keys.items()}
        tasks = [asyncio.create_task(service.run())]
        tasks += [asyncio.create_task(a.run()) for a in agents.values()]
        try:
            await until(lambda: service.api_port is not None, "the API listening")
            yield Rig(service, agents, f"http://127.0.0.1:{service.api_port}", logs)
        finally:
            for a in agents.values():
                a.stop()
            service.stop()
            async with asyncio.timeout(20):
                await asyncio.gather(*tasks, return_exceptions=True)


async def _get(rig: Rig, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=rig.url, timeout=10) as c:
        return await c.get(path)


def _unprotected_gauge(text: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("linkguard_hosts_unprotected ")]
    return float(line.split()[1])


async def _assert_unprotected(rig: Rig, reason: str) -> dict[str, Any]:
    """A (and only A) is unprotected for ``reason`` everywhere the service shows it; B took
    its plan. Returns the service's ``hosts_unprotected`` log line."""
    svc = rig.service
    await until(lambda: rig.events("hosts_unprotected"), "the service's hosts_unprotected")
    await until(lambda: rig.agents[B].applier.plan is not None, f"{B} applying its plan")
    (line,) = rig.events("hosts_unprotected")
    assert line["log_level"] == "error"
    assert (line["host"], line["reason"], line["count"]) == (A, reason, 1)
    assert line["hosts"] == {reason: [A]}
    assert "signing_key" in line["hint"] or "service_public_key" in line["hint"]
    health = await _get(rig, "/api/v1/health")
    assert health.status_code == 503
    doc = health.json()
    assert doc["status"] == "unprotected"
    assert [(u["host"], u["reason"]) for u in doc["unprotected"]] == [(A, reason)]
    assert doc["unprotected"][0]["fix"]
    summary = (await _get(rig, "/api/v1/summary")).json()
    assert [u["host"] for u in summary["unprotected"]] == [A]
    host = (await _get(rig, f"/api/v1/hosts/{A}")).json()
    assert (host["signing"]["verdict"], host["signing"]["reason"]) == ("unprotected", reason)
    other = (await _get(rig, f"/api/v1/hosts/{B}")).json()
    assert other["signing"]["verdict"] != "unprotected"
    assert _unprotected_gauge((await _get(rig, "/metrics")).text) == 1.0
    assert sorted(svc.unprotected) == [A]
    return line


@pytest.mark.real
async def test_agents_require_signed_plans_and_the_service_does_not_sign(
    mosquitto, tmp_path: Path
) -> None:
    _, pub = generate_keys(tmp_path / "keys")
    # A requires plans signed with the key whose public half it has; B has no key
    public_keys: dict[str, Path | None] = {A: pub, B: None}
    async with _running(mosquitto.port, tmp_path, signing_key=None, public_keys=public_keys) as rig:
        line = await _assert_unprotected(rig, "service_unsigned")
        assert "set signing_key on the topology service" in line["hint"]
        # the agent says which side is missing: the service's key
        await until(lambda: rig.events("plans_signing_mismatch"), "the agent's error")
        (mine,) = rig.events("plans_signing_mismatch")
        assert (mine["host"], mine["missing"], mine["reason"]) == (
            A,
            "service_signing_key",
            "unsigned",
        )
        assert "does not sign plans" in mine["hint"] and "signing_key" in mine["hint"]
        assert rig.agents[A].applier.plan is None  # every plan dropped
        # its no_plan_yet (30 s after connecting; here at once) points at the same side
        await rig.agents[A]._expect_plan(after_s=0)
        (waiting,) = rig.events("no_plan_yet")
        assert waiting["missing"] == "service_signing_key" and waiting["hint"] == mine["hint"]
        # A's agent stops (offline: it takes no plans anyway): healthy again
        rig.agents[A].stop()
        await until(lambda: not rig.service.unprotected, "A offline")
        assert (await _get(rig, "/api/v1/health")).status_code == 200
        assert rig.events("hosts_unprotected_cleared")


@pytest.mark.real
async def test_the_service_signs_with_a_key_the_agent_does_not_have(
    mosquitto, tmp_path: Path
) -> None:
    key, pub = generate_keys(tmp_path / "service-keys")
    _, other_pub = generate_keys(tmp_path / "old-keys")
    service_key_id = Signer.from_file(key).key_id
    # A verifies with an old key; B has the service's
    public_keys: dict[str, Path | None] = {A: other_pub, B: pub}
    async with _running(mosquitto.port, tmp_path, signing_key=key, public_keys=public_keys) as rig:
        line = await _assert_unprotected(rig, "unknown_key")
        assert service_key_id in line["hint"] and line["service_key_id"] == service_key_id
        await until(lambda: rig.events("plans_signing_mismatch"), "the agent's error")
        (mine,) = rig.events("plans_signing_mismatch")
        assert (mine["host"], mine["missing"], mine["reason"], mine["key_id"]) == (
            A,
            "agent_public_key",
            "unknown_key",
            service_key_id,
        )
        assert f"signed with key {service_key_id}, unknown here" in mine["hint"]
        assert "service_public_key" in mine["hint"]
        assert rig.agents[A].applier.plan is None
        await rig.agents[A]._expect_plan(after_s=0)
        (waiting,) = rig.events("no_plan_yet")
        assert waiting["missing"] == "agent_public_key" and service_key_id in waiting["hint"]
        other = (await _get(rig, f"/api/v1/hosts/{B}")).json()
        assert other["signing"]["verdict"] == "protected"
        assert other["signing"]["key_ids"] == [service_key_id]
        # the fix: A's agent restarted with the service's public key takes its plan
        rig.agents[A].stop()
        await until(lambda: not rig.service.unprotected, "A's old agent offline")
        fixed = rig.agents[A] = _agent(A, mosquitto.port, tmp_path / "agents", pub)
        task = asyncio.create_task(fixed.run())
        try:
            await until(lambda: fixed.applier.plan is not None, "A applying its plan")
            await until(lambda: rig.service.posture.hosts[A].verdict == "protected", "A ok")
            assert (await _get(rig, "/api/v1/health")).status_code == 200
            assert len(rig.events("hosts_unprotected")) == 1  # never again
        finally:
            fixed.stop()
            async with asyncio.timeout(20):
                await task


@pytest.mark.real
async def test_matched_keys_stay_healthy(mosquitto, tmp_path: Path) -> None:
    key, pub = generate_keys(tmp_path / "keys")
    async with _running(
        mosquitto.port, tmp_path, signing_key=key, public_keys={A: pub, B: pub}
    ) as rig:
        svc = rig.service
        await until(
            lambda: all(a.applier.plan is not None for a in rig.agents.values()),
            "every agent applying its plan",
        )
        await until(lambda: len(svc.posture.hosts) == 2, "both statuses")
        assert (await _get(rig, "/api/v1/health")).status_code == 200
        assert (await _get(rig, "/api/v1/summary")).json()["unprotected"] == []
        for h in (A, B):
            signing = (await _get(rig, f"/api/v1/hosts/{h}")).json()["signing"]
            assert signing["verdict"] == "protected" and signing["required"] is True
        assert _unprotected_gauge((await _get(rig, "/metrics")).text) == 0.0
        assert not rig.events("hosts_unprotected")
        assert not rig.events("plans_signing_mismatch")


def test_assess_every_combination() -> None:
    """The pure decision: who drops the service's plans, who takes them unverified."""
    k1, k2 = "0123456789abcdef", "fedcba9876543210"

    def v(required: bool, keys: list[str], service: str | None) -> tuple[str, str | None]:
        p = assess(SigningPosture(required=required, key_ids=keys), service)
        return p.verdict, p.reason

    assert v(True, [k1], None) == ("unprotected", "service_unsigned")
    assert v(True, [k1], k2) == ("unprotected", "unknown_key")
    assert v(False, [k1], k2) == ("unprotected", "unknown_key")  # it verifies what is signed
    assert v(True, [k1], k1) == ("protected", None)
    assert v(False, [k1], k1) == ("unverified", "unsigned_accepted")
    assert v(False, [k1], None) == ("unverified", "unsigned_accepted")
    assert v(False, [], k1) == ("unverified", "agent_has_no_key")
    assert v(False, [], None) == ("unverified", "unsigned_accepted")
    assert assess(None, k1).verdict == "unknown"  # an older agent


def test_an_older_agents_status_still_decodes() -> None:
    """A status without ``signing`` (agents before it) validates; the new one round-trips."""
    old = b'{"host": "gpu000", "online": true, "at": 1.0, "instance": "ab12"}'
    assert decode(HostStatus, old).signing is None
    new = HostStatus(
        host="gpu000", online=True, signing=SigningPosture(required=True, key_ids=["ab" * 8])
    )
    assert decode(HostStatus, encode(new)) == new


def test_the_desk_logs_when_the_set_of_unprotected_hosts_changes() -> None:
    """One ``hosts_unprotected`` per host that joins (with every one so far, by reason), none
    for a repeated status, ``hosts_unprotected_cleared`` when the last one leaves (offline or
    fixed)."""
    desk = PostureDesk(service_key_id=None)
    requires = SigningPosture(required=True, key_ids=["ab" * 8])

    def status(host: str, *, online: bool = True, signing: SigningPosture | None = requires):
        return desk.on_status(HostStatus(host=host, online=online, signing=signing))

    (first,) = status("h1")
    assert (first.level, first.event, first.fields["hosts"]) == (
        "error",
        "hosts_unprotected",
        {"service_unsigned": ["h1"]},
    )
    assert status("h1") == []  # the same again: nothing new
    (second,) = status("h2")
    assert second.fields["host"] == "h2" and second.fields["count"] == 2
    assert second.fields["hosts"] == {"service_unsigned": ["h1", "h2"]}
    assert status("h1", online=False) == []  # one left, one still unprotected
    assert sorted(desk.unprotected) == ["h2"]
    (cleared,) = status("h2", signing=SigningPosture(required=False))
    assert (cleared.level, cleared.event) == ("info", "hosts_unprotected_cleared")
    assert desk.unprotected == {} and desk.hosts["h2"].verdict == "unverified"
    assert status("h3", signing=None) == []  # an older agent: unknown, never unprotected
