"""Per-rail probes end to end: the real topology service and eight real agents (simulated port
drivers, in-memory route tables) on the in-memory broker, probing each other with real UDP.
One port silently drops packets; the service localises that port from the agents' reports and
moves its host off the rail; when the port forwards again the verdict clears after
``clear_after_s`` and the host gets the rail back. Ports stay up all along: only probes see it.

- loopback (any user): the fabric's rail addresses moved to 127.100.<rail>.<n>; the port stops
  answering because its agent is handed targets without its rail-0 address, so nothing
  listens there any more (its probers' probes are lost);
- the netns lab (root; issue 8's acceptance test): every agent probes from its host's namespace
  of :class:`~linkguard.simulations.lab.Lab` and the port's leaf bridge port is set to the
  disabled state (``bridge link set dev X state 0``): carrier stays up on both veth ends, the
  frames are dropped in the "switch", both directions.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, ProbeRunSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.membus import MemoryBroker, MemoryBus
from linkguard.models import ProbeRail, ProbeTargets, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import require_binary, require_root, until

LAB_FABRIC = generate_rail_optimized(hosts=8, rails=2)
LOOPBACK_FABRIC = Fabric.model_validate_json(
    LAB_FABRIC.model_dump_json().replace("10.100.", "127.100.")
)
VICTIM = "gpu003"
PROBES = ProbeRunSettings(
    enabled=True,
    port=47_931,
    rate_pps=4,
    window_s=1.0,
    timeout_s=0.2,
    min_samples=3,
    clear_after_s=1.0,
    epoch_s=86_400,
)


def _rails_used(service: TopologyService, host: str) -> set[int]:
    return {a.rail for a in service.state.published[host].rail_assignments}


async def _fleet_localises(
    fabric: Fabric,
    tmp_path: Path,
    *,
    netns: Callable[[str], str | None],
    drop: Callable[[MemoryBroker, MemoryBus], object],
    restore: Callable[[MemoryBroker, MemoryBus], object],
) -> list[dict]:
    """Run the fleet, ``await drop(...)`` the victim's rail 0 after every pair answered,
    ``await restore(...)`` once its host left the rail; the ``probe_verdict`` log events."""
    broker = MemoryBroker()

    def factory(**kw):
        return MemoryBus(broker=broker, **kw)

    service = TopologyService(
        ServiceSettings(startup_settle_s=0.2, api={"enabled": False}, probes=PROBES),
        fabric=fabric,
        bus_factory=factory,
    )
    agents = {}
    for inv in fabric.hosts:
        settings = agent_settings_for(
            fabric, inv.host, bus=BusSettings(), workdir=tmp_path, damping=DampingPolicy()
        ).model_copy(update={"probes": PROBES, "netns": netns(inv.host)})
        agents[inv.host] = Agent(
            settings,
            source=SimulatedPortSource([active_port(h.hca, h.port) for h in inv.hcas]),
            table=MemoryRouteTable(),
            discovered=[],
            bus_factory=factory,
        )
    operator = MemoryBus(broker=broker, client_id="test-operator")
    tasks = [asyncio.create_task(service.run())]
    tasks += [asyncio.create_task(a.run()) for a in agents.values()]
    try:
        async with operator:
            await operator.wait_connected(5)
            await until(
                lambda: all(
                    a.prober is not None and a.prober.reports >= 1 for a in agents.values()
                ),
                "every agent to report",
                timeout=20,
            )
            await until(lambda: service.probe_reports >= 8, "the service to take them")
            assert all(_rails_used(service, h) == {0, 1} for h in fabric.host_names)
            # every pair answers: all results fresh, none lossy
            await until(lambda: len(service.probe_results) == 8 * 2 * 4, "all 64 pairs")
            await until(
                lambda: all(r.sent >= 3 and r.lost == 0 for r in service.probe_results.values()),
                "a window of answered probes on every pair",
            )
            assert service.state.probe_suspect == set()
            with capture_logs() as logs:
                await drop(broker, operator)
                t0 = time.monotonic()
                await until(
                    lambda: (
                        VICTIM in service.state.published and _rails_used(service, VICTIM) == {1}
                    ),
                    "the victim host's plan to leave rail 0",
                    timeout=20,
                )
                routed_s = time.monotonic() - t0
                assert service.state.probe_suspect == {(VICTIM, 0)}
                assert all(
                    _rails_used(service, h) == {0, 1} for h in fabric.host_names if h != VICTIM
                )
                await restore(broker, operator)
                t1 = time.monotonic()
                await until(
                    lambda: (
                        not service.state.probe_suspect and _rails_used(service, VICTIM) == {0, 1}
                    ),
                    "the verdict to clear",
                    timeout=20,
                )
            back_s = time.monotonic() - t1
            print(f"\nrouted around {routed_s:.2f} s after the drop, rail back {back_s:.2f} s "
                  f"after the repair (window {PROBES.window_s} s, clear_after "
                  f"{PROBES.clear_after_s} s)")  # fmt: skip
            assert all(a.stats.messages_dropped == {} for a in agents.values())
            assert all(a.prober is not None and a.prober.failures == 0 for a in agents.values())
            # the retained targets deleted (a service restarted with probes off): it stops
            victim = agents[VICTIM].prober
            assert victim is not None and victim.targets is not None
            assert await operator.publish(topics.probe_targets(VICTIM), b"", retain=True)
            await until(lambda: victim.targets is None, "the victim's probes to stop")
            return [e for e in logs if e["event"] in ("probe_verdict", "probe_rail_failed")]
    finally:
        for a in agents.values():
            a.stop()
        service.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


def _verdicts(logs: list[dict]) -> list[tuple[str, str, str, str]]:
    return [
        (e["state"], e["kind"], e["subject"], e["effect"])
        for e in logs
        if e["event"] == "probe_verdict"
    ]


RAISED_CLEARED = [
    ("raised", "port", f"{VICTIM}/rail0", "rail_unusable"),
    ("cleared", "port", f"{VICTIM}/rail0", "rail_usable"),
]


async def test_a_port_that_stops_answering_probes_is_routed_around(tmp_path: Path) -> None:
    topic = topics.probe_targets(VICTIM)
    kept: list[ProbeTargets] = []

    async def drop(broker: MemoryBroker, operator: MemoryBus) -> None:
        mine = decode(ProbeTargets, broker.retained[topic], expect_host=VICTIM)
        kept.append(mine)
        rails = [ProbeRail(rail=0, address="192.0.2.1", peers=[])]  # TEST-NET-1: not here
        rails += [r for r in mine.rails if r.rail != 0]
        gone = mine.model_copy(update={"rails": rails})
        assert await operator.publish(topic, encode(gone), retain=True)

    async def restore(broker: MemoryBroker, operator: MemoryBus) -> None:
        assert await operator.publish(topic, encode(kept[0]), retain=True)

    logs = await _fleet_localises(
        LOOPBACK_FABRIC, tmp_path, netns=lambda h: None, drop=drop, restore=restore
    )
    assert _verdicts(logs) == RAISED_CLEARED
    raised = next(e for e in logs if e["event"] == "probe_verdict")
    # its rail 0 probes nothing now: seen only as a target its healthy probers lose
    assert raised["seen_as"] == ["target"] and raised["lossy"] >= 3
    failed = [e for e in logs if e["event"] == "probe_rail_failed"]
    # said once as a warning; tried again every window (at debug) until the targets change
    assert [e["address"] for e in failed if e["log_level"] == "warning"] == ["192.0.2.1"]
    assert {e["address"] for e in failed} == {"192.0.2.1"}


async def test_lab_silent_drop_on_a_leaf_port_is_localised_and_routed_around(
    tmp_path: Path,
) -> None:
    require_root()
    bridge = require_binary("bridge")
    from linkguard.simulations.lab import Lab

    with Lab.from_fabric(LAB_FABRIC) as lab:
        port = lab.fabric_port(VICTIM, 0)

        def state(n: int) -> None:
            subprocess.run(
                [bridge, "-n", lab.fabric_netns, "link", "set", "dev", port, "state", str(n)],
                check=True,
                capture_output=True,
                timeout=10,
            )

        async def drop(broker: MemoryBroker, operator: MemoryBus) -> None:
            state(0)  # disabled: frames dropped both ways, carrier up

        async def restore(broker: MemoryBroker, operator: MemoryBus) -> None:
            state(3)  # forwarding

        logs = await _fleet_localises(
            LAB_FABRIC,
            tmp_path,
            netns=lambda h: lab.host(h).netns,
            drop=drop,
            restore=restore,
        )
    assert _verdicts(logs) == RAISED_CLEARED
    raised = next(e for e in logs if e["event"] == "probe_verdict")
    # both directions die: its probers lose to it, and it loses to targets others reach
    assert raised["seen_as"] == ["target", "prober"] and raised["lossy"] >= 6
    assert not [e for e in logs if e["event"] == "probe_rail_failed"]
