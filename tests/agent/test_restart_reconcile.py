"""An agent that starts (after a crash or SIGKILL) reconciles linkguard's table with its last
plan before anything else: stale and wrong routes go, missing ones come back, nothing is
duplicated, and it does so without a broker. With ``shutdown_policy: keep`` the routes stay in
place when it stops."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import free_port
from linkguard.config import BusSettings, RouteOptions
from linkguard.drivers.simulated import SimulatedPortSource, active_port
from linkguard.models import LinkLayer
from linkguard.simulations.fleet import agent_settings_for
from linkguard.simulations.lab import Lab
from linkguard.topology.solver import solve
from tests.e2e.harness import TABLE, kernel_routes, lab_fabric
from tests.support import require_root


@pytest.mark.real
async def test_start_reconciles_table_with_last_plan_without_broker(tmp_path: Path) -> None:
    require_root()
    with Lab.create(hosts=3, rails=2) as lab:
        fabric = lab_fabric(lab)
        me = lab.hosts[0]
        plan = solve(fabric, {"host1": frozenset({0})}, epoch=41, now=time.time())[me.name]
        settings = agent_settings_for(
            fabric,
            me.name,
            workdir=tmp_path,
            damping=DampingPolicy(),
            bus=BusSettings(port=free_port(), reconnect_min_s=0.05, reconnect_max_s=0.2),
        ).model_copy(
            update={
                "routes": RouteOptions(apply=True, table=TABLE),
                "netns": me.netns,
                "shutdown_policy": "keep",
            }
        )
        (tmp_path / me.name).mkdir(parents=True)
        (tmp_path / me.name / "last-plan.json").write_text(plan.model_dump_json())

        # What a crashed agent might leave: a stale route, a wrong one, and a missing one.
        ns = ["ip", "-n", me.netns, "route"]
        subprocess.run(
            [*ns, "add", "10.200.9.9/32", "via", "10.100.0.2", "dev", "rail0", "table", str(TABLE)],
            check=True,
        )
        subprocess.run(
            [*ns, "add", "10.200.1.2/32", "via", "10.100.0.2", "dev", "rail0", "table", str(TABLE)],
            check=True,
        )
        subprocess.run(
            [*ns, "add", "10.200.1.1/32", "via", "10.100.0.2", "dev", "rail0", "table", "main"],
            check=True,
        )  # not linkguard's: must survive

        source = SimulatedPortSource(
            [
                active_port(h.hca, h.port, link_layer=LinkLayer.ETHERNET)
                for h in fabric.host(me.name).hcas
            ]
        )
        agent = Agent(settings, source=source, discovered=[])
        task = asyncio.create_task(agent.run())
        want = {str(r.destination): (str(r.gateway), r.netdev) for r in plan.routes}
        # host1 lost rail 0, so host0 reaches host1's GPU-0 endpoint over rail 1
        assert want["10.200.1.1"] == ("10.100.1.2", "rail1")
        deadline = time.monotonic() + 10
        while kernel_routes(me.netns) != want:
            assert time.monotonic() < deadline, kernel_routes(me.netns)
            assert not task.done(), task
            await asyncio.sleep(0.02)
        assert agent.applier.applied_epoch == 41
        assert not agent.bus.connected.is_set()  # no broker was needed
        rules = subprocess.run(
            ["ip", "-n", me.netns, "rule"], capture_output=True, text=True, check=True
        ).stdout
        assert rules.count(f"lookup {TABLE}") == 1

        agent.stop()
        await asyncio.wait_for(task, 10)
        assert kernel_routes(me.netns) == want  # shutdown_policy keep
        main = subprocess.run(
            [*ns, "show", "10.200.1.1/32"], capture_output=True, text=True, check=True
        ).stdout
        assert "10.100.0.2" in main
