"""Issue 21, convergence: "a plan lost in transit stays lost until the next plan for that
host" no more. On real processes: a private Mosquitto, the topology service (HTTP API on) and
two agents in this process, one of them (``bus.subscribe_qos: 0``) behind the chaos proxy
(:mod:`linkguard.simulations.chaosproxy`) that drops ``plans/<host>`` publishes to it.

- On a deadline: the host's new plan is dropped twice; the service logs ``host_not_acking``
  (host, epoch, age), shows the host in ``linkguard_hosts_not_acking``, the API's summary and
  host view, re-sends with its back-off, and the agent acks the current epoch; then every view
  is clear again and ``linkguard_plan_resends_total`` counts the re-sends.
- On a request: an agent whose retained plan is dropped on connecting asks for it
  (``hosts/<host>/plan-request``) and acks long before the re-send deadline.

The pure decisions are in tests/topology/test_convergence.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import ApiSettings, BusSettings, ConvergenceSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.simulations.chaosproxy import ChaosProxy, Rule
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_faults_survived import _stop_all
from tests.test_metrics import value

pytestmark = pytest.mark.real

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOST, OTHER = FABRIC.host_names[0], FABRIC.host_names[1]
AFTER_S = 1.0  # convergence.resend_after_s in these tests


def _agent(tmp: Path, host: str, port: int, qos: int) -> tuple[Agent, SimulatedPortSource]:
    s = agent_settings_for(
        FABRIC,
        host,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3, subscribe_qos=qos),
        damping=DampingPolicy(hold_down_initial_s=60),
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(host).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[]), src


def _service(port: int, *, after_s: float) -> TopologyService:
    return TopologyService(
        ServiceSettings(
            bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
            startup_settle_s=0,
            api=ApiSettings(port=0),
            convergence=ConvergenceSettings(
                resend_after_s=after_s, resend_max_s=4 * after_s, request_min_interval_s=0.5
            ),
        ),
        fabric=FABRIC,
    )


def _acked(service: TopologyService, host: str) -> bool:
    ack, owed = service.state.acks.get(host), service.state.acked_epoch(host)
    return ack is not None and owed is not None and ack.epoch >= owed


@dataclass
class Rig:
    """What :func:`lossy_and_direct` runs: the chaos proxy, HOST's agent behind it and OTHER's
    directly on the broker, each with its simulated port source."""

    proxy: ChaosProxy
    lossy: Agent
    lossy_src: SimulatedPortSource
    direct: Agent
    direct_src: SimulatedPortSource


@contextlib.asynccontextmanager
async def lossy_and_direct(
    service: TopologyService, port: int, tmp_path: Path, *, lossy_qos: int
) -> AsyncIterator[Rig]:
    """``service`` and two agents on the broker at ``port``: HOST's behind a chaos proxy (no
    rules yet; subscribing at ``lossy_qos``), OTHER's directly. Yields once the API is up and
    both acked their first plans; stops all three (deadlines) on the way out."""
    async with ChaosProxy("127.0.0.1", port, seed=21) as proxy:
        lossy, lossy_src = _agent(tmp_path, HOST, proxy.port, qos=lossy_qos)
        direct, direct_src = _agent(tmp_path, OTHER, port, qos=1)
        tasks = [asyncio.create_task(x.run()) for x in (service, lossy, direct)]
        try:
            await until(
                lambda: service.api_port and _acked(service, HOST) and _acked(service, OTHER),
                "first plans acked",
                timeout=15,
            )
            yield Rig(proxy, lossy, lossy_src, direct, direct_src)
        finally:
            await _stop_all([lossy, direct], tasks, service)


async def test_a_dropped_plan_is_resent_and_the_host_shown_until_it_acks(
    mosquitto, tmp_path: Path
) -> None:
    service = _service(mosquitto.port, after_s=AFTER_S)
    async with lossy_and_direct(service, mosquitto.port, tmp_path, lossy_qos=0) as rig:
        proxy, lossy = rig.proxy, rig.lossy
        src = rig.lossy_src
        old = service.state.acked_epoch(HOST)
        assert old is not None
        # its next plan (and the first re-send) never reach it; nor do its own peer
        # routes of that solve, which would tell it that it is behind (it would ask:
        # tests/test_plan_behind_bus.py): only the service's deadline re-sends bring it
        proxy.rules.append(Rule("drop", "down", topics.plan(HOST), count=2))
        proxy.rules.append(Rule("drop", "down", topics.peer_routes(HOST), count=1))
        seen: dict[str, Any] = {"summary": [], "host": [], "gauge": []}
        api = httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.api_port}", timeout=5)
        with capture_logs() as logs:
            lost = FABRIC.host(HOST).hcas[0]
            src.link_down(lost.hca, lost.port)  # a full plan for this host follows
            t0 = time.monotonic()
            await until(lambda: (service.state.acked_epoch(HOST) or 0) > old, "its new plan out")
            new = service.state.acked_epoch(HOST)

            async def watched() -> bool:
                summary = (await api.get("/api/v1/summary")).json()
                host = (await api.get(f"/api/v1/hosts/{HOST}")).json()
                gauge = value((await api.get("/metrics")).text, "linkguard_hosts_not_acking")
                seen["summary"].append(summary["not_acking"])
                seen["host"].append(host["not_acking"])
                seen["gauge"].append(gauge)
                return _acked(service, HOST) and not summary["not_acking"] and gauge == 0

            deadline = time.monotonic() + 10
            while not await watched():
                assert time.monotonic() < deadline, f"never acked epoch {new}: {seen['gauge'][-3:]}"
                await asyncio.sleep(0.05)
            took = time.monotonic() - t0
        print(f"\nplan dropped twice at QoS 0: acked {took:.2f} s after the link went down")
        plans = [a for a in proxy.actions if a[2] == topics.plan(HOST)]
        assert plans == [("down", "drop", topics.plan(HOST))] * 2
        assert proxy.actions.count(("down", "drop", topics.peer_routes(HOST))) == 1
        assert lossy.applier.applied_epoch == new == service.state.acks[HOST].epoch
        # first re-send after AFTER_S (dropped), the second AFTER_S * 2 later (taken)
        assert 3 * AFTER_S <= took < 3 * AFTER_S + 3, took
        warned = [e for e in logs if e["event"] == "host_not_acking"]
        assert [(e["host"], e["epoch"], e["resends"]) for e in warned] == [
            (HOST, new, 1),
            (HOST, new, 2),
        ]
        assert AFTER_S <= warned[0]["age_s"] < AFTER_S + 1.5
        assert 3 * AFTER_S <= warned[1]["age_s"] < 3 * AFTER_S + 1.5
        # shown while late, everywhere, then cleared
        shown = [s for s in seen["summary"] if s]
        assert shown and all(s[0]["host"] == HOST and s[0]["epoch"] == new for s in shown)
        assert any(h and h["epoch"] == new and h["resends"] >= 1 for h in seen["host"])
        assert 1 in seen["gauge"] and seen["gauge"][-1] == 0 and seen["host"][-1] is None
        text = (await api.get("/metrics")).text
        await api.aclose()
        assert value(text, "linkguard_plan_resends_total") == 2


async def test_an_agent_whose_plan_was_lost_on_connecting_asks_for_it(
    mosquitto, tmp_path: Path
) -> None:
    service = _service(mosquitto.port, after_s=30.0)  # no deadline re-send within the test
    rules = [Rule("drop", "down", topics.plan(HOST), count=1)]
    async with ChaosProxy("127.0.0.1", mosquitto.port, rules, seed=21) as proxy:
        tasks = [asyncio.create_task(service.run())]
        try:
            await until(lambda: HOST in service.state.published, "its plan retained", timeout=15)
            lossy, _ = _agent(tmp_path, HOST, proxy.port, qos=0)
            with capture_logs() as logs:
                t0 = time.monotonic()
                tasks.append(asyncio.create_task(lossy.run()))
                await until(lambda: _acked(service, HOST), "the plan acked", timeout=8)
                took = time.monotonic() - t0
            print(f"\nretained plan dropped on connecting: acked {took:.2f} s after the start")
            assert proxy.actions == [("down", "drop", topics.plan(HOST))]  # the retained copy
            answered = [e for e in logs if e["event"] == "plan_request_answered"]
            assert [(e["host"], e["have"], e["reason"]) for e in answered] == [
                (HOST, None, "reconnect")
            ]
            assert answered[0]["owed"] == service.state.acked_epoch(HOST)
            assert lossy.applier.applied_epoch == service.state.acked_epoch(HOST)
            assert took < 5, took
            assert service.convergence.resends == 1
            assert not [e for e in logs if e["event"] == "host_not_acking"]
        finally:
            await _stop_all([lossy] if len(tasks) > 1 else [], tasks, service)
