"""Prometheus metrics (linkguard.metrics): a real agent scraped over HTTP and the topology
service's rendering, on a real Mosquitto, with the exposition parsed by prometheus_client's own
parser; the exporter's settings, its port freed on stop, and a port it cannot bind."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from linkguard import __version__
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import AgentSettings, BusSettings, ConfigError, load_settings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.membus import MemoryBroker
from linkguard.metrics import ServiceMetrics
from linkguard.simulations.fleet import SimulatedFleet, agent_settings_for
from linkguard.topology.generator import generate_rail_optimized
from tests.support import until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOST = FABRIC.hosts[0].host
LOST = next(h for h in FABRIC.hosts[0].hcas if h.rail == 1)  # the port taken down


def _get(port: int, path: str = "/metrics") -> tuple[int, dict[str, str], str]:
    """GET ``path`` from 127.0.0.1:``port`` without following redirects (blocking: run it
    in a thread; the agent's collector answers on the event loop)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    found = samples(text)
    key = (name, frozenset(labels.items()))
    assert key in found, f"no sample {name}{labels} in:\n{text}"
    return found[key]


def _port(**extra: str) -> dict[str, str]:
    return {"hca": LOST.hca, "port": str(LOST.port), "rail": str(LOST.rail), **extra}


@pytest.mark.real
async def test_agent_and_service_metrics_after_a_port_goes_down(mosquitto, tmp_path: Path) -> None:
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    fleet = SimulatedFleet(FABRIC, bus=bus, workdir=tmp_path, settle_s=0.1)
    agent = fleet.agents[HOST]
    # the fleet's agents run without an exporter; this one listens on a free loopback port
    agent.settings = agent.settings.model_copy(update={"metrics_listen": "127.0.0.1:0"})
    assert all(a.settings.metrics_listen is None for h, a in fleet.agents.items() if h != HOST)
    svc_metrics = ServiceMetrics(fleet.service)
    async with fleet:
        await fleet.wait_all_acked()
        await until(lambda: agent.metrics.port is not None, "the exporter listening")
        port = agent.metrics.port
        assert port is not None
        thread = agent.metrics._thread
        status, headers, before = await asyncio.to_thread(_get, port)
        assert status == 200  # no redirect to /metrics/
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert value(before, "linkguard_port_state", **_port()) == 1
        assert value(before, "linkguard_bus_connected") == 1
        assert value(before, "linkguard_port_flaps_total", **_port()) == 0
        assert value(before, "linkguard_neighbours_flushed_total") == 0  # an in-memory table
        applied = value(before, "linkguard_plan_apply_seconds_count", path="plan")
        assert applied >= 1  # the first plan
        assert value(before, "linkguard_plan_epoch_applied") == agent.applier.applied_epoch
        assert value(before, "linkguard_build_info", version=__version__, role="agent", host=HOST)

        epoch = fleet.service.state.epoch
        fleet.link_down(HOST, LOST.rail)
        await fleet.wait_all_acked(epoch_floor=epoch + 1)
        _, _, after = await asyncio.to_thread(_get, port)
        assert value(after, "linkguard_port_state", **_port()) == 0
        assert value(after, "linkguard_port_status", **_port(status="down")) == 1
        assert value(after, "linkguard_port_status", **_port(status="up")) == 0
        assert value(after, "linkguard_port_flaps_total", **_port()) == 1
        assert value(after, "linkguard_port_damping_flaps", **_port()) == 1
        assert value(after, "linkguard_fast_path_total") == agent.stats.fast_paths == 1
        assert value(after, "linkguard_plan_apply_seconds_count", path="fast_path") == 1
        assert value(after, "linkguard_plan_apply_seconds_count", path="plan") > applied
        assert value(after, "linkguard_plan_epoch_applied") == agent.applier.applied_epoch
        assert value(after, "linkguard_bus_connected") == 1
        other = next(h for h in FABRIC.hosts[0].hcas if h.rail != LOST.rail)
        assert value(after, "linkguard_port_state", hca=other.hca, port="1", rail="0") == 1
        assert value(after, "linkguard_port_rate_gbps", hca=other.hca, port="1", rail="0") == 400
        # any path answers, with the same exposition (as prometheus_client's server does)
        status, _, _ = await asyncio.to_thread(_get, port, "/metrics/")
        assert status == 200

        body, ctype = svc_metrics.render()
        text = body.decode()
        assert ctype.startswith("text/plain; version=0.0.4")
        state = fleet.service.state
        assert value(text, "linkguard_plan_epoch") == state.epoch > epoch
        assert value(text, "linkguard_solver_seconds_count") >= 2  # the first build, the down
        assert value(text, "linkguard_solves_total") == fleet.service.solves
        assert value(text, "linkguard_plans_published_total") == fleet.service.plans_published
        assert value(text, "linkguard_ports", status="down") == 1
        assert value(text, "linkguard_ports", status="up") == 3
        assert value(text, "linkguard_ports", status="unknown") == 0
        assert value(text, "linkguard_hosts", state="online") == 2
        assert value(text, "linkguard_hosts", state="offline") == 0
        assert value(text, "linkguard_hosts_pending_ack") == 0
        assert value(text, "linkguard_acks_total", result="applied") >= 4
        assert value(text, "linkguard_acks_total", result="refused") == 0
        assert value(text, "linkguard_ack_apply_seconds_count", path="fast_path") == 1
        # one down, timed to the last ack of the plans that rerouted it
        assert value(text, "linkguard_reroute_seconds_count") == 1
        assert 0 < value(text, "linkguard_reroute_seconds_sum") < 10
        assert value(text, "linkguard_bus_connected") == 1
        # the audit is redone a second after agents come online: wait for the clean one
        await until(lambda: svc_metrics.audit["error"] == 0, "a clean fleet audit", 15)
        text = svc_metrics.render()[0].decode()
        assert value(text, "linkguard_audit_findings", severity="error") == 0
        assert value(text, "linkguard_audit_findings", severity="warning") == 0
        fabric = FABRIC.name
        assert value(
            text, "linkguard_build_info", version=__version__, role="service", fabric=fabric
        )

        # OpenMetrics when the scraper asks for it
        body, ctype = svc_metrics.render("application/openmetrics-text; version=1.0.0")
        assert ctype.startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")
        # from another thread (a sync HTTP handler): read on the service's loop
        body, _ = await asyncio.to_thread(svc_metrics.render)
        assert value(body.decode(), "linkguard_ports", status="down") == 1

    # stopped: the port is closed and free again, the server thread gone
    assert agent.metrics.port is None
    assert thread is not None and not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.to_thread(_get, port)
    with socket.socket() as s:  # what a restarted agent does (HTTPServer sets SO_REUSEADDR)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


@contextlib.contextmanager
def _occupied() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _memory_agent(tmp_path: Path, broker: MemoryBroker, listen: str | None) -> Agent:
    s = agent_settings_for(
        FABRIC, HOST, bus=BusSettings(), workdir=tmp_path, damping=DampingPolicy()
    ).model_copy(update={"metrics_listen": listen})
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.hosts[0].hcas])
    return Agent(
        s, source=src, table=MemoryRouteTable(), discovered=[], bus_factory=broker.bus_factory
    )


async def test_a_port_in_use_is_logged_and_the_agent_runs_on(tmp_path: Path) -> None:
    broker = MemoryBroker()
    with _occupied() as busy, capture_logs() as logs:
        agent = _memory_agent(tmp_path, broker, f"127.0.0.1:{busy}")
        task = asyncio.create_task(agent.run())
        await until(lambda: agent.bus.connected.is_set(), "the agent connected")
        await until(lambda: agent.monitor.state(LOST.key) is not None, "ports read")
        assert agent.metrics.port is None
        # the registry still answers (what the exporter would have served)
        text = agent.metrics.render()[0].decode()
        assert value(text, "linkguard_port_state", **_port()) == 1
        agent.stop()
        await asyncio.wait_for(task, 10)
    failed = [e for e in logs if e["event"] == "metrics_listen_failed"]
    assert len(failed) == 1 and failed[0]["listen"] == f"127.0.0.1:{busy}"


def test_a_dry_run_says_so(tmp_path: Path) -> None:
    """``linkguard_routes_dry_run`` is 1 while ``routes.apply`` is false (plans go to an
    in-memory table) and 0 when they go into the kernel table."""
    dry = _memory_agent(tmp_path / "dry", MemoryBroker(), None)
    assert dry.settings.routes.apply is False
    assert value(dry.metrics.render()[0].decode(), "linkguard_routes_dry_run") == 1
    s = dry.settings.model_copy(
        update={"routes": dry.settings.routes.model_copy(update={"apply": True})}
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.hosts[0].hcas])
    applying = Agent(  # the table given here stands in for the kernel's: nothing is written
        s,
        source=src,
        table=MemoryRouteTable(),
        discovered=[],
        bus_factory=MemoryBroker().bus_factory,
    )
    assert value(applying.metrics.render()[0].decode(), "linkguard_routes_dry_run") == 0


async def test_agents_in_one_process_have_their_own_registries(tmp_path: Path) -> None:
    broker = MemoryBroker()
    a = _memory_agent(tmp_path / "a", broker, None)
    b = _memory_agent(tmp_path / "b", broker, None)
    assert a.metrics.registry is not b.metrics.registry
    a.metrics.flaps[LOST.key] += 3
    assert value(a.metrics.render()[0].decode(), "linkguard_port_flaps_total", **_port()) == 3
    assert value(b.metrics.render()[0].decode(), "linkguard_port_flaps_total", **_port()) == 0
    # before the first reading every port is unknown, not up
    text = b.metrics.render()[0].decode()
    assert value(text, "linkguard_port_state", **_port()) == 0
    assert value(text, "linkguard_port_status", **_port(status="unknown")) == 1
    assert value(text, "linkguard_bus_connected") == 0


@pytest.mark.parametrize(
    "listen", ["9477", "localhost", "127.0.0.1:70000", "http://127.0.0.1:9477", ":9477", "a b:1"]
)
def test_bad_metrics_listen_is_a_config_error(listen: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics_listen: .*HOST:PORT or \[IPV6\]:PORT"):
        load_settings(AgentSettings, host="h", metrics_listen=listen)


@pytest.mark.parametrize(
    ("listen", "expect"),
    [
        ("", None),
        (None, None),
        ("0.0.0.0:9477", "0.0.0.0:9477"),
        ("[::1]:0", "[::1]:0"),
        (" node7.example:9100 ", "node7.example:9100"),
    ],
)
def test_metrics_listen_values(listen: str | None, expect: str | None) -> None:
    assert load_settings(AgentSettings, host="h", metrics_listen=listen).metrics_listen == expect


def test_metrics_listen_defaults_to_loopback_and_env_empty_disables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(AgentSettings, host="h").metrics_listen == "127.0.0.1:9477"
    monkeypatch.setenv("LINKGUARD_METRICS_LISTEN", "")
    assert load_settings(AgentSettings, host="h").metrics_listen is None


def _exported(registry) -> set[str]:
    return {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}


def test_readme_lists_every_metric_and_only_those(tmp_path: Path) -> None:
    from linkguard.config import ServiceSettings
    from linkguard.topology.service import TopologyService

    # the tables of docs/monitoring.md (once the README's "Metrics" section)
    readme = (Path(__file__).resolve().parents[1] / "docs" / "monitoring.md").read_text()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    agent_doc, service_doc = section.split("Topology service (", 1)
    names = re.compile(r"^\| `(linkguard_[a-z_]+)` \|", re.M)
    agent = _memory_agent(tmp_path, MemoryBroker(), None)
    service = TopologyService(ServiceSettings(), fabric=FABRIC)
    assert set(names.findall(agent_doc)) == _exported(agent.metrics.registry)
    assert set(names.findall(service_doc)) == _exported(ServiceMetrics(service).registry)


def test_flaps_total_counts_the_monitors_flaps(tmp_path: Path) -> None:
    """Fed the monitor's events, the counter follows the monitor's own flap count (down, back
    in hold-down, down again, back and in use) and, unlike it, never resets."""
    from dataclasses import replace

    from linkguard.models import PhysState, PortStateName

    agent = _memory_agent(tmp_path, MemoryBroker(), None)
    up = active_port(LOST.hca, LOST.port)
    down = replace(up, state=PortStateName.DOWN, phys_state=PhysState.POLLING)
    hold = agent.monitor.policy.hold_down_initial_s
    quiet = agent.monitor.policy.quiet_period_s
    for now, obs, flaps in [
        (0.0, up, 0),  # the first reading: no flap
        (1.0, down, 1),
        (2.0, up, 1),  # held down
        (3.0, down, 2),  # down again inside the hold-down
        (4.0, up, 2),
    ]:
        out = agent.monitor.observe([obs], now=now, wall=1e9 + now)
        agent.metrics.observe_events(out.events)
        assert agent.metrics.flaps[LOST.key] == flaps
        assert agent.monitor.state(LOST.key).damping.flaps == flaps  # type: ignore[union-attr]
    # the hold-down after two flaps (2 x the initial one) is over
    out = agent.monitor.tick(now=4.0 + 3 * hold, wall=1e9 + 4.0 + 3 * hold)
    agent.metrics.observe_events(out.events)
    text = agent.metrics.render()[0].decode()
    assert value(text, "linkguard_port_state", **_port()) == 1
    assert value(text, "linkguard_port_flaps_total", **_port()) == 2
    out = agent.monitor.tick(now=4.0 + quiet + 1, wall=1e9 + quiet + 1)  # history forgotten
    text = agent.metrics.render()[0].decode()
    assert value(text, "linkguard_port_damping_flaps", **_port()) == 0
    assert value(text, "linkguard_port_flaps_total", **_port()) == 2


def test_flaps_total_counts_a_flap_no_reading_saw(tmp_path: Path) -> None:
    """A rise of the netdev's carrier_changes between two usable readings (linkguard.agent.
    linkkinds) is a flap of the monitor's, up -> held_down: the counter counts it too."""
    from dataclasses import replace

    agent = _memory_agent(tmp_path, MemoryBroker(), None)
    up = replace(active_port(LOST.hca, LOST.port), carrier=True, carrier_changes=4)
    for now, obs, flaps in [(0.0, up, 0), (1.0, replace(up, carrier_changes=6), 1)]:
        out = agent.monitor.observe([obs], now=now, wall=1e9 + now)
        agent.metrics.observe_events(out.events)
        assert agent.metrics.flaps[LOST.key] == flaps
        assert agent.monitor.state(LOST.key).damping.flaps == flaps  # type: ignore[union-attr]
    text = agent.metrics.render()[0].decode()
    assert value(text, "linkguard_port_flaps_total", **_port()) == 1
    assert value(text, "linkguard_port_held_down", **_port()) == 1
