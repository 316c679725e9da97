"""``linkguard fabric discover`` and ``fabric facts`` end to end: a real agent on a copy of
the real H100 tree (its mlx5_0 given an X5 CA's GUIDs) in a namespace whose IPoIB stand-in
carries the rail address publishes its discovery document on a real Mosquitto; the command,
a separate process, reads it and joins it with the real X5 dump into a fabric the service's
loader accepts. The same from ``fabric facts`` files; bad usage exits 2."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.config import AgentSettings, BusSettings, PortConfig, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import decode
from linkguard.models.discovery import HostDiscovery
from linkguard.topology.serviceio import fabric_from_settings
from tests.support import H100, netns_with, retained

LLDP = Path(__file__).resolve().parent / "fixtures" / "lldp"
CA = "003048c707b60000"  # the first CA of X5.topofile


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "linkguard.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def host_ns() -> Iterator[str]:
    """A namespace with the host's IPoIB stand-in ``ibp0s0`` (a veth) on 10.100.0.7/24."""
    cmds = [
        "link add ibp0s0 type veth peer name leafp1",
        "addr add 10.100.0.7/24 dev ibp0s0",
        "link set ibp0s0 up",
    ]
    with netns_with("lg-disc", cmds) as ns:
        yield ns


@pytest.fixture
def tree(tmp_path: Path, fixtures_real: Path) -> Path:
    """The real H100 tree, mlx5_0 with the X5 CA's node GUID, port GUID and IPoIB netdev."""
    t = tmp_path / "infiniband"
    shutil.copytree(fixtures_real / H100, t)
    (t / "mlx5_0" / "node_guid").write_text("0030:48c7:07b6:0000\n")
    (t / "mlx5_0" / "ports" / "1" / "gids").mkdir()
    (t / "mlx5_0" / "ports" / "1" / "gids" / "0").write_text(
        "fe80:0000:0000:0000:0030:48c7:07b6:0001\n"
    )
    (t / "mlx5_0" / "device" / "net" / "ibp0s0").mkdir(parents=True)
    return t


def _agent_settings(tmp: Path, port: int, tree: Path, ns: str) -> AgentSettings:
    return AgentSettings(
        host="x5570comp9",
        driver="sysfs",
        sysfs_root=tree,
        netns=ns,
        bus=BusSettings(port=port, reconnect_min_s=0.05),
        routes={"apply": False},
        ports=[PortConfig(hca="mlx5_0", rail=0)],
        endpoints=[ipaddress.IPv4Address("10.200.0.7")],
        discovery={"lldp_file": LLDP / "host-one-neighbour.json"},
        state_dir=tmp / "state",
        rail_map_path=tmp / "run" / "rail-map.json",
        metrics_listen=None,
        verbs={"events": "off"},
        log_format="console",
    )


def _check_fabric(path: Path, unknowns: Path) -> None:
    fabric = fabric_from_settings(ServiceSettings(fabric=path))
    (host,) = fabric.hosts
    assert host.host == "x5570comp9" and host.endpoints == [ipaddress.IPv4Address("10.200.0.7")]
    (hca,) = host.hcas
    assert (hca.hca, hca.rail, hca.netdev, str(hca.address)) == (
        "mlx5_0",
        0,
        "ibp0s0",
        "10.100.0.7",
    )
    assert fabric.rail_subnets == {0: ipaddress.IPv4Network("10.100.0.0/24")}
    (link,) = [lk for lk in fabric.links if lk.kind == "host-leaf"]
    assert (link.b, link.b_port) == ("S-0008f10500200b50", 32)  # where X5 cables that CA
    rows = json.loads(unknowns.read_text())
    assert {(r["device"], r["rule"]) for r in rows if r["host"] == "x5570comp9"} == {
        *((f"{h}/1", "not_in_switch_graph") for h in ("mlx5_1", "mlx5_4", "mlx5_5")),
        *((f"{h}/1", "not_in_switch_graph") for h in ("mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")),
        ("mlx5_bond_0/1", "not_compute"),
    }


@pytest.mark.real
async def test_an_agent_publishes_what_discover_reads_from_the_bus(
    mosquitto, tmp_path: Path, tree: Path, host_ns: str, fixtures_real: Path
) -> None:
    settings = _agent_settings(tmp_path, mosquitto.port, tree, host_ns)
    agent = Agent(
        settings,
        source=SimulatedPortSource([active_port("mlx5_0", 1)]),
        table=MemoryRouteTable(),
        discovered=[],
    )
    task = asyncio.create_task(agent.run())
    try:
        payload = await retained(mosquitto.port, topics.discovery("x5570comp9"), timeout=15)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
    doc = decode(HostDiscovery, payload)
    assert len(doc.ports) == 9 and doc.ports[0].node_guid == CA
    assert doc.ports[0].port_guid == "003048c707b60001" and doc.ports[0].netdev == "ibp0s0"
    assert sorted(n.name for n in doc.netdevs) == ["ibp0s0", "leafp1"]  # lo left out
    assert [str(a) for n in doc.netdevs if n.name == "ibp0s0" for a in n.ipv4] == ["10.100.0.7/24"]
    assert [(n.netdev, n.system) for n in doc.lldp] == [("vB", "su0-leaf0")]
    assert doc.inventory is not None and doc.inventory.hcas[0].hca == "mlx5_0"
    # the retained document outlives the agent: discover reads it from the broker
    out, unknowns = tmp_path / "fabric.yaml", tmp_path / "unknowns.json"
    done = _cli(
        "fabric",
        "discover",
        "--broker",
        f"127.0.0.1:{mosquitto.port}",
        "--wait",
        "1",
        "--ibnetdiscover",
        str(fixtures_real / "ltaulell-HPC_toolset" / "X5.topofile"),
        "-o",
        str(out),
        "--unknowns",
        str(unknowns),
    )
    assert done.returncode == 0, done.stderr
    assert "1 discovery documents from 127.0.0.1" in done.stderr
    assert "discovered 1 hosts, 1 rails" in done.stderr
    assert "unknown: x5570comp9 mlx5_bond_0/1: not_compute" in done.stderr
    _check_fabric(out, unknowns)


@pytest.mark.real
def test_facts_files_make_the_same_fabric(
    tmp_path: Path, tree: Path, host_ns: str, fixtures_real: Path
) -> None:
    config = tmp_path / "agent.yaml"
    settings = _agent_settings(tmp_path, 1883, tree, host_ns)
    config.write_text(json.dumps(json.loads(settings.model_dump_json(exclude={"bus"}))))
    facts = tmp_path / "facts"
    facts.mkdir()
    done = _cli("fabric", "facts", "-c", str(config), "-o", str(facts / "x5570comp9.json"))
    assert done.returncode == 0, done.stderr
    doc = decode(HostDiscovery, (facts / "x5570comp9.json").read_bytes())
    assert doc.host == "x5570comp9" and doc.ports[0].node_guid == CA
    (facts / "notes.txt").write_text("not a document, not *.json")
    out, unknowns = tmp_path / "fabric.json", tmp_path / "unknowns.json"
    dump = str(fixtures_real / "ltaulell-HPC_toolset" / "X5.topofile")
    done = _cli(
        "fabric",
        "discover",
        "--facts",
        str(facts),
        "--ibnetdiscover",
        dump,
        "-o",
        str(out),
        "--unknowns",
        str(unknowns),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["name"] == "discovered"
    _check_fabric(out, unknowns)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ibnetdiscover", "x"], "no host reports"),
        (["--facts", "x"], "give one switch graph"),
        (["--facts", "x", "--lldp", "--ibnetdiscover", "y"], "give one switch graph"),
        (["--facts", "x", "--lldp", "--guid-map", "g"], "--guid-map goes with --ibnetdiscover"),
        (["--facts", "x", "--lldp", "--switch-lldp", "noequals"], "give NAME=FILE"),
        (["--facts", "/nonexistent.json", "--lldp"], "cannot read"),
    ],
)
def test_bad_usage_exits_2(args: list[str], message: str) -> None:
    done = _cli("fabric", "discover", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_two_documents_of_one_host_and_an_empty_name_are_refused(tmp_path: Path) -> None:
    doc = HostDiscovery(host="gpu000").model_dump_json()
    (tmp_path / "a.json").write_text(doc)
    (tmp_path / "b.json").write_text(doc)
    done = _cli("fabric", "discover", "--facts", str(tmp_path), "--lldp")
    assert done.returncode == 2
    assert "host 'gpu000' again (also in" in done.stderr and "a.json" in done.stderr
    done = _cli("fabric", "discover", "--facts", str(tmp_path / "a.json"), "--lldp", "--name", "")
    assert done.returncode == 2 and "--name: 1 to 128 characters" in done.stderr


def test_a_file_that_is_no_discovery_document_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "h.json"
    bad.write_text('{"host": "h", "ports": "nope"}')
    done = _cli("fabric", "discover", "--facts", str(bad), "--lldp")
    assert done.returncode == 2
    assert f"{bad}: not a discovery document: HostDiscovery: ports" in done.stderr
    assert os.path.exists(bad)
