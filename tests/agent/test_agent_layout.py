"""The agent reports its host layout (PCIe switch per HCA and GPU) in the inventory it
publishes: read once at start from the PCI sysfs tree next to the IB driver's
(``<root>/class/infiniband`` -> ``<root>/bus/pci/devices``) or from ``nccl_topo_file``; a
layout that cannot be read leaves the inventory without switch ids and the agent running.
Real Mosquitto; the PCI tree is tests/drivers/test_pci.py's, the XML the real p5 file."""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.inventory import pci_root, with_layout
from linkguard.config import AgentSettings, BusSettings, PortConfig
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.layout import parse_nccl_topo
from linkguard.models import HostInventory, decode
from tests.conftest import FIXTURES
from tests.drivers.test_pci import build_tree
from tests.support import retained, until

S0, S1 = "0000:01:00.0", "0000:81:00.0"  # the two switches of test_pci.py's host


def _settings(tmp: Path, port: int, hcas: list[str], gpus: int, **kw) -> AgentSettings:
    return AgentSettings(
        host="gpu000",
        bus=BusSettings(port=port, reconnect_min_s=0.05),
        routes={"apply": False},
        ports=[PortConfig(hca=h, rail=r) for r, h in enumerate(hcas)],
        endpoints=[ipaddress.IPv4Address(f"10.200.{g}.1") for g in range(gpus)],
        state_dir=tmp / "state",
        rail_map_path=tmp / "run" / "rail-map.json",
        metrics_listen=None,
        log_format="console",
        **kw,
    )


async def _published(settings: AgentSettings, port: int) -> tuple[Agent, HostInventory]:
    """Run an agent until its inventory is retained on the broker; (agent, inventory)."""
    src = SimulatedPortSource([active_port(p.hca, p.port) for p in settings.ports])
    agent = Agent(settings, source=src, table=MemoryRouteTable(), discovered=[])
    task = asyncio.create_task(agent.run())
    try:
        payload = await retained(port, topics.inventory("gpu000"), timeout=10)
        await until(lambda: agent.monitor.state(settings.ports[0].hca + "/1"), "a reading")
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
    return agent, decode(HostInventory, payload)


@pytest.mark.real
async def test_layout_from_the_pci_tree(mosquitto, tmp_path: Path) -> None:
    build_tree(tmp_path / "sys")
    settings = _settings(
        tmp_path,
        mosquitto.port,
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        gpus=2,
        driver="sysfs",
        sysfs_root=tmp_path / "sys" / "class" / "infiniband",
    )
    agent, inv = await _published(settings, mosquitto.port)
    assert [(h.hca, h.pcie_switch, h.numa_node) for h in inv.hcas] == [
        ("mlx5_0", S0, 0),
        ("mlx5_1", S0, 0),
        ("mlx5_2", S1, 1),
        ("mlx5_3", S1, None),  # numa_node -1 in sysfs: no affinity
    ]
    assert inv.gpu_pcie_switch == [S0, S1]
    assert inv.gpu_numa == [0, None]  # GPU 1's numa_node is garbage in the tree
    assert agent.inventory == inv  # what it announced is what it holds


@pytest.mark.real
async def test_layout_from_the_nccl_topology_file(mosquitto, tmp_path: Path) -> None:
    """p5.48xlarge: one EFA NIC per GPU as the rails; each on its GPU's switch."""
    xml = Path(shutil.copy(FIXTURES / "aws-ofi-nccl" / "p5.48xl-topo.xml", tmp_path / "t.xml"))
    nics = ["rdmap79s0", "rdmap96s0", "rdmap113s0", "rdmap130s0"]
    nics += ["rdmap147s0", "rdmap164s0", "rdmap181s0", "rdmap198s0"]
    settings = _settings(
        tmp_path, mosquitto.port, nics, gpus=8, driver="simulated", nccl_topo_file=xml
    )
    _, inv = await _published(settings, mosquitto.port)
    switches = [f"0000:0{i}:00.0" for i in range(8)]
    assert [h.pcie_switch for h in inv.hcas] == switches
    assert inv.gpu_pcie_switch == switches
    assert [h.numa_node for h in inv.hcas] == [0] * 8


@pytest.mark.real
async def test_a_bad_layout_is_logged_once_and_not_fatal(mosquitto, tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text('<system><cpu numaid="zero"/></system>')
    settings = _settings(
        tmp_path, mosquitto.port, ["mlx5_0", "mlx5_1"], gpus=2, driver="simulated",
        nccl_topo_file=bad,
    )  # fmt: skip
    with capture_logs() as logs:
        _, inv = await _published(settings, mosquitto.port)
    said = [e for e in logs if e["event"] == "host_layout_unavailable"]
    assert len(said) == 1 and said[0]["log_level"] == "warning"
    assert said[0]["reason"] == f"LayoutError: {bad}: <cpu> has numaid='zero', not an integer"
    assert [h.pcie_switch for h in inv.hcas] == [None, None]
    assert inv.gpu_pcie_switch == []


@pytest.mark.real
async def test_no_pci_tree_leaves_the_inventory_as_it_was(mosquitto, tmp_path: Path) -> None:
    """The sysfs driver on a root without bus/pci (a container without /sys of the host):
    the inventory is what the config and discovery give, said once at info."""
    settings = _settings(
        tmp_path, mosquitto.port, ["mlx5_0"], gpus=1, driver="sysfs",
        sysfs_root=tmp_path / "sys" / "class" / "infiniband",
    )  # fmt: skip
    with capture_logs() as logs:
        _, inv = await _published(settings, mosquitto.port)
    said = [e for e in logs if e["event"] == "host_layout_unavailable"]
    assert [e["log_level"] for e in said] == ["info"]
    assert said[0]["reason"] == "no layout source: no nccl_topo_file, no PCI sysfs tree"
    assert (inv.hcas[0].pcie_switch, inv.gpu_pcie_switch, inv.gpu_numa) == (None, [], [])


def test_pci_root_is_next_to_the_ib_class_only() -> None:
    assert pci_root(Path("/sys/class/infiniband")) == Path("/sys")
    assert pci_root(Path("/host/sys/class/infiniband")) == Path("/host/sys")
    # a copied tree of the IB class alone (the real fixtures) has no PCI tree beside it
    assert pci_root(FIXTURES / "leptonai-gpud/tree/sys-class-infiniband-h100.0") is None


def test_a_layout_of_other_devices_is_not_applied(tmp_path: Path) -> None:
    """A PCI tree with neither a GPU nor one of the host's HCAs says nothing about the host:
    the inventory stays as it was, with the reason."""
    inv = HostInventory(host="gpu000", hcas=[{"hca": "mlx5_7", "rail": 0}])
    layout = parse_nccl_topo(
        '<system><cpu numaid="0"><pci busid="0000:01:00.0" class="0x060400">'
        '<pci busid="0000:05:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0"/></nic>'
        "</pci></pci></cpu></system>",
        source="other.xml",
    )
    assert with_layout(inv, layout) == (
        inv,
        "other.xml: no GPU and none of the host's HCAs found",
    )
    assert with_layout(inv, None)[0] is inv
