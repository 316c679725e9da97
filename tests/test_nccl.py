"""NCCL renderings of a host's plan (linkguard.nccl): NCCL_IB_HCA, the fused-NIC layout for
NCCL's port failover, the agent's files, and ``linkguard nccl env`` on the host and against a
real topology service's API.

Port states come from the real monitor (linkguard.agent.monitor) fed simulated readings, plans
from the real solver, so "held down" is what the monitor says after a flap and "not in the
plan" is what the solver leaves out."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.config import ApiSettings, BusSettings
from linkguard.drivers.simulated import active_port
from linkguard.jobenv import AgentLock
from linkguard.models import HCAInfo, HostInventory, PhysState, PortStateName, PortStatus
from linkguard.nccl import (
    NcclFiles,
    env_lines,
    fused_layout,
    hca_selects,
    ib_hca,
    port_verdicts,
    render,
)
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import solve
from tests.conftest import start_mosquitto
from tests.support import until

#: 4 hosts x 8 rails; gpu000 has mlx5_0..mlx5_7 on rails 0-7, NUMA node 0 for rails 0-3, 1 for 4-7
FABRIC = generate_rail_optimized(hosts=4, rails=8)
HOST = "gpu000"
ALL8 = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"


class Host:
    """One host's real port monitor driven by simulated readings on a simulated clock, and
    the solver's plan for what the monitor says."""

    def __init__(self, inv: HostInventory) -> None:
        self.inv = inv
        self.now = 1000.0
        self.mon = PortMonitor(
            host=inv.host,
            policy=DampingPolicy(hold_down_initial_s=10, hold_down_max_s=300),
            rails={h.key: h.rail for h in inv.hcas},
        )
        self.readings = {h.key: active_port(h.hca, h.port) for h in inv.hcas}
        self.mon.observe(self.readings.values(), now=self.now, wall=self.now)
        self.now += 3.0  # the rates held rate_settle_s: each port's reference
        self.mon.tick(now=self.now, wall=self.now)
        self.epoch = 0

    def _hca(self, rail: int) -> HCAInfo:
        return next(h for h in self.inv.hcas if h.rail == rail)

    def set(self, rail: int, **fields: object) -> None:
        key = self._hca(rail).key
        self.readings[key] = replace(self.readings[key], **fields)  # type: ignore[arg-type]
        self.now += 0.5
        self.mon.observe([self.readings[key]], now=self.now, wall=self.now)

    def down(self, rail: int) -> None:
        self.set(rail, state=PortStateName.DOWN, phys_state=PhysState.POLLING)

    def up(self, rail: int) -> None:
        self.set(rail, state=PortStateName.ACTIVE, phys_state=PhysState.LINK_UP)

    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.mon.tick(now=self.now, wall=self.now)

    def states(self):
        return [self.mon.state(h.key) for h in self.inv.hcas]

    def status(self, rail: int) -> PortStatus:
        st = self.mon.state(self._hca(rail).key)
        assert st is not None
        return st.status

    def plan(self):
        """The solver's plan for the rails the monitor calls unusable (what the service
        publishes after it hears the states)."""
        self.epoch += 1
        unusable = frozenset(
            h.rail for h, st in zip(self.inv.hcas, self.states(), strict=True) if not st.usable
        )
        return solve(FABRIC, {self.inv.host: unusable}, epoch=self.epoch, now=self.now)[
            self.inv.host
        ]


@pytest.fixture
def host() -> Host:
    return Host(FABRIC.host(HOST))


# -- the four cases of the issue ---------------------------------------------------------------


def test_all_healthy(host: Host) -> None:
    r = render(host.inv, host.states(), host.plan())
    assert r.ib_hca == ALL8
    assert r.env == {"NCCL_IB_HCA": ALL8}
    assert [(v.nccl_name, v.usable, v.why) for v in r.ports] == [
        (f"mlx5_{i}:1", True, None) for i in range(8)
    ]
    # fused pairs on one NUMA node each (the generator's inventory has no PCIe switches)
    assert [(g.name, g.basis, g.state) for g in r.layout.groups] == [
        ("mlx5_0+mlx5_1", "numa", "intact"),
        ("mlx5_2+mlx5_3", "numa", "intact"),
        ("mlx5_4+mlx5_5", "numa", "intact"),
        ("mlx5_6+mlx5_7", "numa", "intact"),
    ]
    assert r.failover_env == {
        "NCCL_IB_HCA": ALL8,
        "NCCL_IB_MERGE_NICS": "1",
        "NCCL_NET_MERGE_LEVEL": "LOC",
        "NCCL_NET_FORCE_MERGE": "mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1;"
        "mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1",
        "NCCL_IB_RESILIENCY_PORT_FAILOVER": "1",
    }
    assert r.layout.warnings == []
    text = r.layout.tradeoff()
    assert "8 ports of 400 Gb/s become 4 fused NICs of up to 2 (800 Gb/s each)" in text
    assert "NCCL sees 4 devices instead of 8" in text
    assert "leaves that NIC 400 Gb/s (50%) and the host 7/8 of its bandwidth" in text


def test_one_rail_held_down_then_back(host: Host) -> None:
    host.down(3)
    host.up(3)
    assert host.status(3) == PortStatus.HELD_DOWN  # the real monitor's hold-down
    plan = host.plan()
    assert 3 not in {a.rail for a in plan.rail_assignments}
    r = render(host.inv, host.states(), plan)
    assert r.env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
    }
    assert [(v.nccl_name, v.why) for v in r.ports if not v.usable] == [("mlx5_3:1", "held_down")]
    # its pair already lost a port: not fused for new jobs, and said so
    assert [(g.name, g.state) for g in r.layout.groups][1] == ("mlx5_2+mlx5_3", "lost_one")
    assert r.failover_env["NCCL_NET_FORCE_MERGE"] == (
        "mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1"
    )
    assert len(r.layout.warnings) == 1
    assert r.layout.warnings[0].startswith(
        "fused NIC mlx5_2+mlx5_3 lost mlx5_3:1 (held_down): a job fusing it would not survive "
        "a second loss in it"
    )
    # hold-down over: usable locally, but the plan in hand still leaves rail 3 out
    host.wait(10.5)
    assert host.status(3) == PortStatus.UP
    r = render(host.inv, host.states(), plan)
    assert [(v.nccl_name, v.why) for v in r.ports if not v.usable] == [("mlx5_3:1", "not_in_plan")]
    # the service's next plan takes it back: all eight again
    r = render(host.inv, host.states(), host.plan())
    assert r.ib_hca == ALL8 and r.layout.warnings == []


def test_two_rails_down_on_one_host(host: Host) -> None:
    host.down(1)
    host.down(6)
    r = render(host.inv, host.states(), host.plan())
    assert r.env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_7:1"}
    assert [(v.nccl_name, v.why) for v in r.ports if not v.usable] == [
        ("mlx5_1:1", "down"),
        ("mlx5_6:1", "down"),
    ]
    assert [g.state for g in r.layout.groups] == ["lost_one", "intact", "intact", "lost_one"]
    assert r.failover_env["NCCL_NET_FORCE_MERGE"] == "mlx5_2:1,mlx5_3:1;mlx5_4:1,mlx5_5:1"
    # both of one pair: broken, the survivors unfused
    host.up(1)
    host.up(6)
    host.wait(11)
    host.down(4)
    host.down(5)
    r = render(host.inv, host.states(), host.plan())
    assert r.ib_hca == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1"
    assert [g.state for g in r.layout.groups] == ["intact", "intact", "broken", "intact"]
    assert r.layout.warnings == [
        "fused NIC mlx5_4+mlx5_5 lost mlx5_4:1 (down), mlx5_5:1 (down): the survivors are left "
        "unfused"
    ]


def test_a_port_that_came_back_slower_is_left_out(host: Host) -> None:
    host.set(5, rate_gbps=200.0)  # retrained at half rate (e.g. 2 of 4 lanes)
    assert host.status(5) == PortStatus.DEGRADED  # the monitor drains it too: one signal
    plan = host.plan()
    assert 5 not in {a.rail for a in plan.rail_assignments}
    r = render(host.inv, host.states(), plan)
    assert r.env == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_6:1,mlx5_7:1"
    }
    bad = next(v for v in r.ports if v.rail == 5)
    assert (bad.why, bad.rate_gbps, bad.expected_gbps) == ("degraded", 200.0, 400.0)
    # every port slower than the fabric's rate: none usable, IB off rather than an empty list
    # (an empty NCCL_IB_HCA selects every device)
    for rail in range(8):
        host.set(rail, rate_gbps=200.0)
    r = render(host.inv, host.states(), host.plan(), expected_gbps=400.0)
    assert r.ib_hca is None
    assert r.env == {"NCCL_IB_DISABLE": "1"} == r.failover_env
    assert {v.why for v in r.ports} == {"degraded"}


# -- NCCL_IB_HCA syntax ----------------------------------------------------------------------


def test_exact_prefix_keeps_mlx5_1_from_matching_mlx5_10() -> None:
    inv = HostInventory(host="h", hcas=[HCAInfo(hca=f"mlx5_{i}", rail=i) for i in range(12)])
    h = Host(inv)
    h.down(10)
    h.down(11)
    verdicts = port_verdicts(inv, h.states())
    value = ib_hca(verdicts)
    assert value == "=" + ",".join(f"mlx5_{i}:1" for i in range(10))
    # NCCL's matching (net_ib/init.cc, matchIfList) of that value
    assert hca_selects(value, "mlx5_1", 1)
    assert not hca_selects(value, "mlx5_10", 1) and not hca_selects(value, "mlx5_11", 1)
    # without the "=" every entry is a prefix: mlx5_1 would also select the down mlx5_10
    assert hca_selects(value[1:], "mlx5_10", 1)
    assert hca_selects(value[1:], "mlx5_11", 1)


def test_hca_selects_follows_nccl_syntax() -> None:
    assert hca_selects(None, "mlx5_0", 1) and hca_selects("", "mlx5_0", 1)
    assert hca_selects("mlx5", "mlx5_7", 1)
    assert not hca_selects("=mlx5_0:1", "mlx5_0", 2)  # other port
    assert hca_selects("=mlx5_0", "mlx5_0", 2)  # no port: every port
    assert not hca_selects("^mlx5_1", "mlx5_12", 1)  # excluded by prefix
    assert hca_selects("^=mlx5_1", "mlx5_12", 1)  # only mlx5_1 excluded
    assert not hca_selects("^=mlx5_1", "mlx5_1", 1)


def test_bad_input_is_a_clear_error(host: Host) -> None:
    other = FABRIC.host("gpu001")
    with pytest.raises(ValueError, match="state of gpu000:mlx5_0/1 given for host gpu001"):
        port_verdicts(other, host.states())
    with pytest.raises(ValueError, match="plan of gpu000 given for host gpu001"):
        port_verdicts(other, [], host.plan())
    with pytest.raises(ValueError, match="fused NIC size 5: must be 2 to 4"):
        fused_layout(port_verdicts(host.inv, host.states()), size=5)
    # a port without any state is not used
    r = render(host.inv, host.states()[1:], None)
    assert [(v.nccl_name, v.why) for v in r.ports if not v.usable] == [("mlx5_0:1", "unknown")]


def test_layout_prefers_the_pcie_switch_then_numa() -> None:
    # rails 0 and 5 share a switch; 1-4 on NUMA 0, 6-7 on NUMA 1: the switch pairs first
    inv = HostInventory(
        host="h",
        hcas=[HCAInfo(hca=f"mlx5_{i}", rail=i, numa_node=0 if i < 5 else 1) for i in range(8)],
    )
    h = Host(inv)
    verdicts = port_verdicts(inv, h.states())
    layout = fused_layout(verdicts, switch_of={"mlx5_0/1": "sw0", "mlx5_5/1": "sw0"})
    assert [(g.name, g.basis) for g in layout.groups] == [
        ("mlx5_0+mlx5_5", "pcie_switch"),
        ("mlx5_1+mlx5_2", "numa"),
        ("mlx5_3+mlx5_4", "numa"),
        ("mlx5_6+mlx5_7", "numa"),
    ]
    # groups of 4 on an odd count: the one left over stands alone, and is said to
    five = port_verdicts(inv, h.states())[:5]
    layout = fused_layout(five, size=4)
    assert [(g.name, g.state) for g in layout.groups] == [
        ("mlx5_0+mlx5_1+mlx5_2+mlx5_3", "intact"),
        ("mlx5_4", "single"),
    ]
    assert layout.warnings == ["mlx5_4:1 (rail 4) is alone in its group: no port failover"]


def test_env_file_sources_in_a_real_shell(host: Host, tmp_path: Path) -> None:
    host.down(2)
    r = render(host.inv, host.states(), host.plan())
    text = env_lines(r.failover_env)
    assert (
        text.splitlines()[0]
        == "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
    )
    assert "NCCL_NET_FORCE_MERGE='mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1'\n" in text
    f = tmp_path / "nccl.env"
    f.write_text("# a comment line\n" + text)
    out = subprocess.run(
        ["sh", "-c", f'set -a; . "{f}"; env'],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    ).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("NCCL_"))
    assert got == r.failover_env
    exported = env_lines(r.env, export=True)
    assert exported == (
        "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1\n"
    )


# -- the agent's files ---------------------------------------------------------------------------


P5 = Path(__file__).resolve().parents[2] / "shared/fixtures/real/aws-ofi-nccl/p5.48xl-topo.xml"


def test_files_written_atomically_only_when_changed(host: Host, tmp_path: Path) -> None:
    files = NcclFiles(tmp_path / "run")
    plan = host.plan()
    r = files.update(host.inv, host.states(), plan)
    assert r is not None
    env = tmp_path / "run" / "nccl.env"
    assert env.read_text() == (
        f"# linkguard NCCL settings for gpu000, plan epoch {plan.epoch}\nNCCL_IB_HCA={ALL8}\n"
    )
    doc = json.loads((tmp_path / "run" / "nccl.json").read_text())
    assert doc["ib_hca"] == ALL8 and doc["epoch"] == plan.epoch
    inode = env.stat().st_ino
    files.update(host.inv, host.states(), plan)  # nothing changed: nothing rewritten
    assert env.stat().st_ino == inode
    # a new epoch that changes nothing for NCCL (peer routes moved) rewrites nothing either
    assert files.update(host.inv, host.states(), host.plan()) is not None
    assert env.stat().st_ino == inode and f"epoch {plan.epoch}\n" in env.read_text()
    env.unlink()  # a file removed under the agent comes back with the next update
    files.update(host.inv, host.states(), plan)
    assert env.read_text().endswith(f"NCCL_IB_HCA={ALL8}\n")
    inode = env.stat().st_ino
    host.down(7)
    plan = host.plan()
    files.update(host.inv, host.states(), plan)
    assert env.stat().st_ino != inode  # a new file renamed over the old one
    assert env.read_text().splitlines()[1:] == [
        "# left out: mlx5_7:1 rail 7 (down)",
        "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1",
    ]
    failover = (tmp_path / "run" / "nccl-failover.env").read_text()
    assert "# needs NCCL >= 2.29.7\n" in failover
    assert "# warning: fused NIC mlx5_6+mlx5_7 lost mlx5_7:1 (down)" in failover
    assert not list((tmp_path / "run").glob(".*tmp"))  # no temporary file left


def test_files_with_a_topology_file_and_a_broken_one(tmp_path: Path) -> None:
    if not P5.is_file():
        pytest.skip(f"real fixture missing: {P5}")
    src = tmp_path / "topo.xml"
    src.write_bytes(P5.read_bytes())
    # 8 of the p5's 32 EFA devices (the first two of each of its first two switches) as rails
    names = [f"rdmap{n}s0" for n in (79, 80, 81, 82, 96, 97, 98, 99)]
    inv = HostInventory(host="p5", hcas=[HCAInfo(hca=n, rail=i) for i, n in enumerate(names)])
    h = Host(inv)
    h.down(1)
    files = NcclFiles(tmp_path / "run", topology_file=src)
    r = files.update(inv, h.states(), None)
    assert r is not None and r.topology is not None
    topo = tmp_path / "run" / "nccl-topo.xml"
    assert r.env == {
        "NCCL_IB_HCA": "=rdmap79s0:1,rdmap81s0:1,rdmap82s0:1,rdmap96s0:1,rdmap97s0:1,"
        "rdmap98s0:1,rdmap99s0:1",
        "NCCL_TOPO_FILE": str(topo),
    }
    assert r.topology["removed"] == ["rdmap80s0/1"]
    xml = topo.read_text()
    assert xml.startswith("<!-- linkguard: removed rdmap80s0:1 (down) -->\n<system")
    assert '<net name="rdmap80s0"' not in xml and '<net name="rdmap81s0"' in xml
    # a topology file that turns hostile: logged, nothing raised, the last files stay
    before = topo.read_text()
    src.write_text('<!DOCTYPE system [<!ENTITY a "aaaa">]><system>&a;</system>')
    h.up(1)
    assert files.update(inv, h.states(), None) is None
    assert topo.read_text() == before


# -- the command line ------------------------------------------------------------------------------


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # the agent's settings come from the config file alone (LINKGUARD_* would override it)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    return subprocess.run(
        [sys.executable, "-m", "linkguard.cli", "nccl", "env", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_cli_reads_the_agents_files(host: Host, tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    run = tmp_path / "run"
    cfg.write_text(yaml.safe_dump({"host": HOST, "rail_map_path": str(run / "rail-map.json")}))
    out = _cli("-c", str(cfg))
    assert out.returncode == 1 and "nccl.json does not exist: is the agent running?" in out.stderr
    host.down(3)
    host.up(3)
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    # files, but no agent running: they may name a lost rail (as linkguard exec's exit 75)
    out = _cli("-c", str(cfg))
    assert out.returncode == 1 and out.stdout == ""
    assert f"no agent holds {run}/agent.lock (the agent is not running)" in out.stderr
    stale = _cli("-c", str(cfg), "--allow-stale")
    assert stale.returncode == 0 and stale.stdout.startswith("NCCL_IB_HCA==mlx5_0:1,")
    lock = AgentLock(run)
    out = _cli("-c", str(cfg))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1\n"
    )
    out = _cli("-c", str(cfg), "--format", "shell", "--profile", "failover")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
        "export NCCL_IB_MERGE_NICS=1",
        "export NCCL_NET_MERGE_LEVEL=LOC",
        "export NCCL_NET_FORCE_MERGE='mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1'",
        "export NCCL_IB_RESILIENCY_PORT_FAILOVER=1",
    ]
    assert "linkguard: warning: fused NIC mlx5_2+mlx5_3 lost mlx5_3:1 (held_down)" in out.stderr
    out = _cli("-c", str(cfg), "--format", "json")
    doc = json.loads(out.stdout)
    assert [p["why"] for p in doc["ports"]][3] == "held_down"
    assert doc["failover"]["min_nccl_version"] == "2.29.7"
    out = _cli("-c", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "missing.yaml" in out.stderr
    lock.release()


FLEET = generate_rail_optimized(hosts=4, rails=4, hosts_per_su=4)


@pytest.mark.real
async def test_cli_host_against_the_service_api_matches_the_agents_files(
    tmp_path: Path,
) -> None:
    """A real service (HTTP API on a free port) and real agents over Mosquitto: ``nccl env
    --host H`` from the API and the file H's agent wrote say the same, healthy, with a rail
    down, and with a port that came back slower."""
    broker = start_mosquitto(tmp_path / "broker")
    victim = "gpu002"
    try:
        async with SimulatedFleet(
            FLEET,
            bus=BusSettings(port=broker.port, reconnect_min_s=0.05),
            workdir=tmp_path / "fleet",
            damping=DampingPolicy(hold_down_initial_s=0.2, hold_down_max_s=0.2),
            debounce_ms=20,
            api=ApiSettings(port=0),
        ) as fleet:
            await fleet.wait_all_acked()
            api = f"http://127.0.0.1:{fleet.service.api_port}"
            agent_env = tmp_path / "fleet" / victim / "nccl.env"

            async def both() -> tuple[str, str]:
                out = await asyncio.to_thread(_cli, "--host", victim, "--api", api)
                assert out.returncode == 0, out.stderr
                lines = agent_env.read_text().splitlines()
                return out.stdout, "".join(x + "\n" for x in lines if not x.startswith("#"))

            healthy = "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1\n"
            await until(lambda: agent_env.is_file(), "the agent's nccl.env", 10)
            assert await both() == (healthy, healthy)

            epoch = fleet.service.state.epoch
            fleet.link_down(victim, 2)
            await until(lambda: fleet.service.state.epoch > epoch, "a new plan", 10)
            await fleet.wait_all_acked(epoch + 1)
            down = "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_3:1\n"
            await until(lambda: down in agent_env.read_text(), "the agent's new nccl.env", 10)
            assert await both() == (down, down)
            doc = json.loads(
                (
                    await asyncio.to_thread(
                        _cli, "--host", victim, "--api", api, "--format", "json"
                    )
                ).stdout
            )
            assert doc["epoch"] == fleet.agents[victim].applier.applied_epoch
            assert [(p["nccl_name"], p["why"]) for p in doc["ports"] if not p["usable"]] == [
                ("mlx5_2:1", "down")
            ]

            epoch = fleet.service.state.epoch
            fleet.link_up(victim, 2)
            await until(lambda: fleet.service.state.epoch > epoch, "the rail back", 10)
            await fleet.wait_all_acked(epoch + 1)
            await until(lambda: healthy in agent_env.read_text(), "all four again", 10)
            # rail 1 comes back at half its cable's rate: NCCL leaves it out, the agent drains it
            fleet.sources[victim].set("mlx5_1", 1, rate_gbps=200.0)
            slow = "NCCL_IB_HCA==mlx5_0:1,mlx5_2:1,mlx5_3:1\n"
            await until(lambda: slow in agent_env.read_text(), "the agent's degraded view", 10)
            key = (victim, "mlx5_1/1")
            await until(
                lambda: fleet.service.state.ports[key].rate_gbps == 200.0, "the slow state", 10
            )
            assert await both() == (slow, slow)

            out = await asyncio.to_thread(_cli, "--host", "nosuchhost", "--api", api)
            assert out.returncode == 2 and "unknown host 'nosuchhost'" in out.stderr
        started = time.monotonic()
        out = await asyncio.to_thread(_cli, "--host", victim, "--api", api)
        assert out.returncode == 1 and "Connection refused" in out.stderr
        assert time.monotonic() - started < 30
    finally:
        broker.handle.stop()
