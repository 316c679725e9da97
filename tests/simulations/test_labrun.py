"""``linkguard sim lab``: scenarios on network namespaces with real agents, service and Mosquitto.

The pure parts (which flows a scenario gets, how a gap is read from a flow record, which
scenarios a lab refuses) run everywhere; the replays need root and mosquitto. The bound on the
with-linkguard gap (1000 ms, the scenario's own ``max_reroute_ms``) is ~10x what this machine
measures (60-95 ms for the flow into the failed rail); the benchmark
(benchmarks/lab_gap.py) prints the distribution.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from ipaddress import IPv4Address
from pathlib import Path

import pytest
import yaml

from linkguard import topics
from linkguard.bus import BusMessage
from linkguard.cli import main
from linkguard.models import Ack, AckResult, Plan, encode
from linkguard.simulations.lab import Lab
from linkguard.simulations.labflows import flow_gap
from linkguard.simulations.labprocs import (
    UDPFLOW,
    Flow,
    LabProcessError,
    Observer,
    Procs,
    until,
)
from linkguard.simulations.labrun import (
    LabRunError,
    check_lab_scenario,
    choose_flows,
    run_lab,
)
from linkguard.simulations.scenario import SCENARIOS_DIR, load_scenario
from linkguard.topology.fabric import dump_fabric
from linkguard.topology.generator import generate_rail_optimized
from tests.support import require_binary, require_root


def golden(name: str):
    return load_scenario(SCENARIOS_DIR / f"{name}.yaml")


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


# --------------------------------------------------------------------------------------------
# Pure parts


def test_flows_to_and_from_the_faulted_port_plus_a_control_flow() -> None:
    fabric = golden("single-link-down").fabric
    flows = choose_flows(fabric, [("gpu001", 1)])
    assert [(s.src_host, str(s.src), s.dst_host, str(s.dst), role) for s, role in flows] == [
        ("gpu002", "10.200.1.3", "gpu001", "10.200.1.2", "to"),
        ("gpu001", "10.200.1.2", "gpu002", "10.200.1.3", "from"),
        ("gpu000", "10.200.0.1", "gpu003", "10.200.0.4", "control"),
    ]
    assert len({s.port for s, _ in flows}) == 3


def test_flows_of_a_leaf_reboot_cross_the_spine_to_spread_peers() -> None:
    loaded = golden("leaf-reboot")  # su0-leaf2: gpu000-gpu003 lose rail 2
    targets = [(f"gpu00{i}", 2) for i in range(4)]
    flows = choose_flows(loaded.fabric, targets)
    into = [(s.src_host, s.dst_host) for s, role in flows if role == "to"]
    assert into == [("gpu004", "gpu000"), ("gpu005", "gpu001"), ("gpu006", "gpu002"),
                    ("gpu007", "gpu003")]  # fmt: skip
    assert all(str(s.dst).startswith("10.200.2.") for s, role in flows if role == "to")
    control = [s for s, role in flows if role == "control"]
    assert len(control) == 1 and control[0].src_host not in {"gpu000", "gpu001"}


def test_gap_reads_the_longest_silence_and_the_loss(tmp_path: Path) -> None:
    out = tmp_path / "flow.txt"
    # every 2 ms from 10.000 s, seq 100-149 lost (10.200 -> 10.300 silent), then on to 10.500
    rows = [(s, 10.0 + s * 0.002) for s in range(250) if not 100 <= s < 150]
    out.write_text("".join(f"{s} {t:.6f}\n" for s, t in rows))
    flow = Flow(None, None, None, out)  # type: ignore[arg-type]
    gap, lost, resumed = flow_gap(flow, 10.1, 10.4, 11.0)
    assert (round(gap, 3), lost, resumed) == (102.0, 50, True)
    # a flow that never comes back is silent until the end of the run
    gap, lost, resumed = flow_gap(flow, 10.45, 12.0, 13.0)
    assert (round(gap), lost, resumed) == (2502, -1, False)


def test_lab_refuses_file_fabrics_and_large_fabrics(tmp_path: Path) -> None:
    fabric = generate_rail_optimized(hosts=4, rails=2, hosts_per_su=4, spines_per_su=1)
    (tmp_path / "f.yaml").write_text(dump_fabric(fabric, "yaml"))
    doc = {
        "schema": "linkguard.scenario/v1",
        "name": "from-file",
        "description": "A fabric file.",
        "fabric": {"file": "f.yaml"},
        "duration_s": 5,
        "timeline": [{"at_s": 1, "kind": "link_down", "host": "gpu001", "rail": 1}],
    }
    (tmp_path / "file.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(LabRunError, match="generated fabrics only"):
        check_lab_scenario(load_scenario(tmp_path / "file.yaml"), environment=False)
    doc |= {"name": "big", "fabric": {"generate": {"hosts": 64, "rails": 4}}}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(LabRunError, match="64 hosts x 4 rails is too large"):
        check_lab_scenario(load_scenario(tmp_path / "big.yaml"), environment=False)
    assert main(["sim", "lab", str(tmp_path / "big.yaml")]) == 2


def test_lab_workdir_that_cannot_be_made_is_a_clear_error(capsys) -> None:
    require_root()  # the check after the scenario's: it needs the lab's environment
    path = str(SCENARIOS_DIR / "single-link-down.yaml")
    args = ["sim", "lab", path, "--workdir", "/proc/linkguard-x"]
    assert main(args) == 2
    assert "--workdir /proc/linkguard-x: No such file or directory" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# On the kernel


def _prober(lab: Lab, host: str) -> subprocess.Popen:
    h = lab.host(host)
    p = lab.exec(
        host,
        [sys.executable, str(UDPFLOW), "probe", "47999", *map(str, h.endpoints)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


async def _probe(lab: Lab, src: str, pairs: list[tuple[IPv4Address, IPv4Address]]) -> list[bool]:
    """Probe ``pairs`` from host ``src`` with a prober of its own (the others echo)."""
    lines = "".join(f"p {i} {s} {d}\n" for i, (s, d) in enumerate(pairs))
    out, _ = await asyncio.to_thread(_prober(lab, src).communicate, lines + "go 300\n", 15)
    got = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("r "))
    return [got[str(i)] == "1" for i in range(len(pairs))]


async def test_fabric_lab_has_a_spine_per_rail_and_cut_uplinks_isolate_a_leaf() -> None:
    require_root()
    fabric = golden("leaf-reboot").fabric  # 2 SUs x 4 hosts, 4 rails
    with Lab.from_fabric(fabric) as lab:
        assert [h.name for h in lab.hosts] == fabric.host_names
        g0, g1, g5 = lab.host("gpu000"), lab.host("gpu001"), lab.host("gpu005")
        assert g5.endpoints == fabric.host("gpu005").endpoints
        assert lab.rail("gpu005", 2).address == fabric.host("gpu005").hcas[2].address
        assert lab.leaves["su1-leaf2"] == "l1r2" and lab.uplinks["su1-leaf2"] == "l1r2u"
        for lh in lab.hosts:  # on-link routes, as a plan's all-up prefix routes are
            script = "".join(
                f"route add {net} dev rail{r}\n" for r, net in fabric.endpoint_subnets.items()
            )
            subprocess.run(["ip", "-n", lh.netns, "-batch", "-"], input=script, text=True)
        for h in ("gpu001", "gpu005"):
            _prober(lab, h)  # echoes until the lab is destroyed
        pairs = [(g0.endpoints[2], g5.endpoints[2]), (g0.endpoints[2], g1.endpoints[2])]
        assert await _probe(lab, "gpu000", pairs) == [True, True]  # across the spine, within
        lab.uplink_down("su0-leaf2")
        assert await _probe(lab, "gpu000", pairs) == [False, True]
        lab.uplink_up("su0-leaf2")
        assert await _probe(lab, "gpu000", pairs) == [True, True]
    assert lab.prefix not in "".join(netns_names())


@pytest.mark.real
async def test_single_link_down_with_linkguard(tmp_path: Path) -> None:
    require_root()
    require_binary("mosquitto")
    require_binary("lldpd")
    before = set(netns_names())  # other labs may run on this machine meanwhile: judge ours
    # on the fabric discovered from lldpd and the agents (issue 22; `sim lab --discover`): the
    # same scenario, the same checks, and the discovered fabric must be the lab's
    report = await run_lab(golden("single-link-down"), workdir=tmp_path, discover=True)
    assert report.passed, report.text()
    assert report.discovered is not None
    assert (report.discovered["hosts"], report.discovered["leaves"]) == (4, 4)
    assert report.discovered["unknowns"] == [] and report.discovered["differences"] == []
    assert report.mismatch_count == 0 and report.checks >= 3 and report.probes >= 192
    (fault,) = report.faults
    assert (fault.at_s, fault.kind, fault.what) == (2.0, "link_down", "link_down gpu001 rail 1")
    roles = {g.role: g for g in fault.flows}
    assert set(roles) == {"to", "from"}
    for g in fault.flows:  # both directions resume well before the link returns (6 s)
        assert g.resumed and not g.until_return
        assert 0 < g.gap_ms < 1000, report.text()
    assert fault.last_ack_ms is not None and 0 < fault.last_ack_ms < 1000
    assert fault.checked and fault.mismatches == 0
    assert [(e.name, e.held) for e in report.expectations] == [
        ("reachability", True),
        ("max_reroute_ms", True),
    ]
    assert report.exit_codes == dict.fromkeys(report.exit_codes, 0)
    assert len(report.exit_codes) == 5  # the service and four agents, all exited cleanly
    # every namespace of this lab torn down (other labs may run on this machine meanwhile)
    assert report.netns_prefix is not None and report.netns_prefix.startswith("lg")
    left = set(netns_names()) - before
    assert not any(n.startswith(report.netns_prefix) for n in netns_names()), left
    print("\n" + report.text())


@pytest.mark.real
async def test_single_link_down_without_linkguard_stays_broken_until_the_link_returns(
    tmp_path: Path,
) -> None:
    require_root()
    require_binary("mosquitto")
    report = await run_lab(golden("single-link-down"), linkguard=False, workdir=tmp_path)
    assert report.passed and not report.linkguard  # a baseline run: breakage is the finding
    (fault,) = report.faults
    down_ms = 6000.0  # link_down at 2 s, link_up at 8 s
    for g in fault.flows:
        assert g.until_return and g.resumed
        assert 0.8 * down_ms < g.gap_ms < down_ms + 1000, report.text()
        # one datagram per 2 ms at most: a sender that is late does not catch up (no bursts),
        # so on a busy machine fewer are sent; at least a quarter of the rate, never more
        assert 0.25 * down_ms / 2 < g.lost <= (down_ms + 1000) / 2
    assert report.mismatch_count > 0  # gpu001's rail-1 endpoint is unreachable meanwhile
    assert all("10.200.1.2" in m for m in report.mismatches)
    assert "broken for" in report.text() and "until the link returned" in report.text()
    assert [(e.name, e.held) for e in report.expectations] == [
        ("reachability", False),
        ("max_reroute_ms", False),
    ]
    assert report.exit_codes == {}


async def test_a_timed_out_wait_prints_what_the_observer_saw(tmp_path: Path) -> None:
    """A lab wait that times out names, per host, the plan and ack epochs that arrived and the
    message count by kind: a message the broker never delivered shows as a missing epoch."""
    obs = Observer()
    for host in ("h0", "h1"):
        plan = Plan(host=host, epoch=7, issued_at=0, routes=[])
        await obs.handle(BusMessage(topics.plan(host), encode(plan), True))
    ack = Ack(host="h1", epoch=7, result=AckResult.APPLIED, applied_at=1.0)
    await obs.handle(BusMessage(topics.ack("h1"), encode(ack), True))
    procs = Procs(tmp_path)
    procs.seen = lambda: obs.summary(["h0", "h1"])
    with pytest.raises(LabProcessError) as err:
        await until(lambda: all(obs.acked(h, 7) for h in ("h0", "h1")), 0.05, "acks", procs)
    text = str(err.value)
    assert "timed out after 0.05 s waiting for acks" in text
    assert "h0: plans [7] acks (epoch, result, fast path) []" in text
    assert "h1: plans [7] acks (epoch, result, fast path) [(7, <AckResult.APPLIED" in text
    assert "messages by kind: {'plan': 2, 'ack': 1}" in text


def test_lab_processes_do_not_import_a_source_tree_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a new user: `sim lab` run from a clone's root after the README's plain
    `pip install .` started every process on the clone's source tree (`python -m` puts the
    working directory first on sys.path), which has no linkguard.drivers: each exited 1. The
    lab's processes run with -P. Here a working directory whose `linkguard` package fails to
    import stands for that tree."""
    from linkguard.simulations.labprocs import Procs

    shadow = tmp_path / "cwd" / "linkguard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the source tree was imported')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    procs = Procs(tmp_path)
    p = procs.start("help", ["--help"])
    assert p.wait(timeout=60) == 0, (tmp_path / "help.log").read_text()[-2000:]
    assert "usage: linkguard" in (tmp_path / "help.log").read_text()
