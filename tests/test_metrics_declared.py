"""The metric declarations (linkguard.metrics: AGENT_METRICS, SERVICE_METRICS, which
docs/metrics.md is rendered from) are what the registries export: after a short real run (an
agent and the topology service on an in-memory bus, a port taken down), every exported family
is declared with its name, type, help text and exactly the label names its series carry, and
every declared family is exported."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import ApiSettings, BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.membus import MemoryBroker
from linkguard.metrics import AGENT_METRICS, SERVICE_METRICS, MetricSpec, ServiceMetrics
from linkguard.metricsdocs import render_metrics
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOST = FABRIC.hosts[0].host
LOST = next(h for h in FABRIC.hosts[0].hcas if h.rail == 1)


def _exported_name(name: str, type_: str) -> str:
    return name + ("_total" if type_ == "counter" else "")


def _check(registry: CollectorRegistry, specs: tuple[MetricSpec, ...]) -> set[str]:
    """Every family ``registry`` exports matches its declaration; returns the names of the
    families that had series (their labels were checked on the series themselves)."""
    declared = {s.name: s for s in specs}
    assert len(declared) == len(specs), "a metric is declared twice"
    exported = list(registry.collect())
    names = [_exported_name(m.name, m.type) for m in exported]
    assert names == [s.name for s in specs]  # each once, in the declared order
    with_series = set()
    for fam in exported:
        spec = declared[_exported_name(fam.name, fam.type)]
        assert (fam.type, fam.documentation) == (spec.type, spec.help), spec.name
        for sample in fam.samples:
            used = tuple(k for k in sample.labels if k != "le")
            assert used == spec.labels, (sample, spec.labels)
            with_series.add(spec.name)
        if not fam.samples:  # no series now: the label names the family was built with
            assert tuple(getattr(fam, "_labelnames", ())) == spec.labels, spec.name
    return with_series


async def test_declared_metrics_are_exactly_the_exported_ones(tmp_path: Path) -> None:
    broker = MemoryBroker()
    service = TopologyService(
        ServiceSettings(api=ApiSettings(enabled=False)),
        fabric=FABRIC,
        bus_factory=broker.bus_factory,
    )
    service_metrics = ServiceMetrics(service)
    settings = agent_settings_for(
        FABRIC, HOST, bus=BusSettings(), workdir=tmp_path, damping=DampingPolicy()
    ).model_copy(update={"metrics_listen": None})
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.hosts[0].hcas])
    agent = Agent(
        settings,
        source=source,
        table=MemoryRouteTable(),
        discovered=[],
        bus_factory=broker.bus_factory,
    )
    tasks = [asyncio.create_task(service.run()), asyncio.create_task(agent.run())]
    try:
        await until(lambda: agent.applier.applied_epoch is not None, "the agent applied a plan")
        source.link_down(LOST.hca, LOST.port)
        await until(lambda: service_metrics.acks["applied"] >= 2, "the reroute acked")
        agent_series = _check(agent.metrics.registry, AGENT_METRICS)
        service_series = _check(service_metrics.registry, SERVICE_METRICS)
    finally:
        agent.stop()
        service.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    # the per-port, per-path and per-state families were checked on real series
    for name in ("linkguard_port_status", "linkguard_plan_apply_seconds", "linkguard_build_info"):
        assert name in agent_series
    for name in ("linkguard_hosts", "linkguard_ports", "linkguard_ack_apply_seconds"):
        assert name in service_series


def test_the_page_lists_every_declared_metric() -> None:
    page = render_metrics()
    agent, service = page.split("\n## Topology service", 1)
    for part, specs in ((agent, AGENT_METRICS), (service, SERVICE_METRICS)):
        for spec in specs:
            assert f"| `{spec.name}` | " in part
