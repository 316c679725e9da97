"""Real device naming and link kinds (issue 22, part 3) on copies of the real gpud H100 tree
(``mlx5_0, mlx5_1, mlx5_4..mlx5_9`` InfiniBand, ``mlx5_bond_0`` RoCE LAG, no PCI ``device``
link), each changed minimally: a net class beside it (``sys/class/net``: the bond's
``bonding/slaves``, a member's ``master`` link), a RoCE port's ``gid_attrs/ndevs/0`` or
``device/net/<name>``, and for the all-Ethernet host the ``link_layer`` files."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.assembly import carrier_ports, discover, make_inventory
from linkguard.agent.daemon import Agent
from linkguard.agent.inventory import is_bond, lag_problems
from linkguard.config import AgentSettings
from linkguard.drivers.netclass import NetdevLinks, net_root, read_netdev_links
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.membus import MemoryBroker
from linkguard.models import HostInventory, HostStatus, LinkLayer, decode
from tests.support import H100, H100_IB_HCAS, until


@pytest.fixture
def sys_tree(tmp_path: Path, fixtures_real: Path) -> Path:
    """``<tmp>/sys`` with the H100 capture as ``class/infiniband`` and an empty ``class/net``."""
    ib = tmp_path / "sys" / "class" / "infiniband"
    shutil.copytree(fixtures_real / H100, ib)
    for f in ib.rglob("*"):  # the capture is read-only; the copy is edited
        f.chmod(0o755 if f.is_dir() else 0o644)
    (tmp_path / "sys" / "class" / "net").mkdir()
    return ib


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def bond(net: Path, name: str, members: list[str]) -> None:
    """A bond master ``name`` and its members, as the bonding driver lays them out."""
    write(net / name / "bonding" / "slaves", " ".join(members))
    for m in members:
        (net / m).mkdir(parents=True, exist_ok=True)
        (net / m / "master").symlink_to(f"../{name}")


def roce_netdev(ib: Path, hca: str, netdev: str) -> None:
    """The RoCE port's netdev, as mlx5 shows it (``ports/1/gid_attrs/ndevs/0``)."""
    write(ib / hca / "ports" / "1" / "gid_attrs" / "ndevs" / "0", netdev)


def test_net_root_and_links(sys_tree: Path) -> None:
    net = net_root(sys_tree)
    assert net == sys_tree.parent / "net"
    assert net_root(Path("/tmp/some-copy")) is None
    bond(net, "bond0", ["ens1f0np0", "ens1f1np1"])
    assert read_netdev_links(net, "bond0") == NetdevLinks(
        bond=True, members=("ens1f0np0", "ens1f1np1")
    )
    assert read_netdev_links(net, "ens1f1np1") == NetdevLinks(master="bond0")
    assert read_netdev_links(net, "ib0") == NetdevLinks()
    assert read_netdev_links(net, "..") == NetdevLinks()


def test_h100_bond_is_no_rail_next_to_infiniband(sys_tree: Path) -> None:
    """The H100's RoCE LAG (its in-band/storage NIC) with its members known: a bond, kept out
    of the rails since the host has InfiniBand ports; the 8 IB ports are the rails, in
    natural name order (no PCI address)."""
    net = net_root(sys_tree)
    assert net is not None
    roce_netdev(sys_tree, "mlx5_bond_0", "bond0")
    bond(net, "bond0", ["ens1f0np0", "ens1f1np1"])
    settings = AgentSettings(host="h100", sysfs_root=sys_tree)
    found = discover(settings)
    b = next(d for d in found if d.hca == "mlx5_bond_0")
    assert (b.netdev, b.bond_netdev, b.members, b.link_layer) == (
        "bond0",
        True,
        ("ens1f0np0", "ens1f1np1"),
        LinkLayer.ETHERNET,
    )
    assert is_bond(b) and lag_problems(found) == []
    inv = make_inventory(settings, found)
    assert [h.hca for h in inv.hcas] == H100_IB_HCAS
    assert [h.rail for h in inv.hcas] == list(range(8))


def test_bond_named_device_without_netdev_is_a_bond(sys_tree: Path) -> None:
    """The capture as it is (no netdev at all): ``mlx5_bond_N`` is a bond by its name."""
    found = discover(AgentSettings(host="h100", sysfs_root=sys_tree))
    assert [d.hca for d in found if is_bond(d)] == ["mlx5_bond_0"]


def roce_host(ib: Path, net: Path) -> None:
    """The H100 tree turned into an all-Ethernet (RoCE) host: every port's link layer
    Ethernet, each device's netdev as mlx5 shows it; ``mlx5_bond_0`` on ``bond0``
    (members ``ens1f0np0``, ``ens1f1np1``: the LAG formed), and ``mlx5_5`` / ``mlx5_6``
    whose netdevs were put in ``bond1`` without a LAG device forming (misconfigured)."""
    for ll in ib.glob("*/ports/*/link_layer"):
        ll.write_text("Ethernet\n")
    for hca in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"):
        roce_netdev(ib, hca, f"ens{hca.removeprefix('mlx5_')}np0")
    roce_netdev(ib, "mlx5_bond_0", "bond0")
    bond(net, "bond0", ["ens1f0np0", "ens1f1np1"])
    bond(net, "bond1", ["ens5np0", "ens6np0"])


def test_roce_host_bond_is_a_rail_and_lag_misconfiguration_is_reported(sys_tree: Path) -> None:
    net = net_root(sys_tree)
    assert net is not None
    roce_host(sys_tree, net)
    settings = AgentSettings(host="roce1", sysfs_root=sys_tree)
    found = discover(settings)
    problems = lag_problems(found)
    assert problems == [
        "mlx5_5/1: netdev ens5np0 is a member of bond1, but mlx5_5 is no bond device "
        "(RoCE LAG not active): not a rail",
        "mlx5_6/1: netdev ens6np0 is a member of bond1, but mlx5_6 is no bond device "
        "(RoCE LAG not active): not a rail",
    ]
    with capture_logs() as logs:
        inv = make_inventory(settings, found)
    # the bond is a rail; the misconfigured members are not; natural order, no PCI address
    assert [(h.hca, h.rail, h.netdev) for h in inv.hcas] == [
        ("mlx5_0", 0, "ens0np0"),
        ("mlx5_1", 1, "ens1np0"),
        ("mlx5_4", 2, "ens4np0"),
        ("mlx5_7", 3, "ens7np0"),
        ("mlx5_8", 4, "ens8np0"),
        ("mlx5_9", 5, "ens9np0"),
        ("mlx5_bond_0", 6, "bond0"),
    ]
    assert all(h.link_layer == LinkLayer.ETHERNET for h in inv.hcas)
    lag = [e for e in logs if e["event"] == "rdma_lag_misconfigured"]
    assert [e["problem"] for e in lag] == problems
    assert all(e["log_level"] == "warning" and "bond mode" in e["hint"] for e in lag)
    # the bond's health source reads the bond and every member
    watched = {p.hca: p for p in carrier_ports(inv, found)}
    assert (watched["mlx5_bond_0"].netdev, watched["mlx5_bond_0"].members) == (
        "bond0",
        ("ens1f0np0", "ens1f1np1"),
    )
    assert watched["mlx5_4"].members == ()
    assert set(watched) == {h.hca for h in inv.hcas}


def test_ipoib_netdev_of_an_infiniband_port_is_watched(sys_tree: Path) -> None:
    """An IB port with an IPoIB netdev (``device/net/ib0``, one port, one name): the
    netdev's carrier is read next to sysfs (evidence, link layer InfiniBand)."""
    (sys_tree / "mlx5_0" / "device" / "net" / "ibp0s0").mkdir(parents=True)
    settings = AgentSettings(host="h100", sysfs_root=sys_tree)
    found = discover(settings)
    inv = make_inventory(settings, found)
    watched = carrier_ports(inv, found)
    assert [(p.hca, p.netdev, p.link_layer) for p in watched] == [
        ("mlx5_0", "ibp0s0", LinkLayer.INFINIBAND)
    ]


def _agent_settings(tmp: Path, root: Path, host: str) -> AgentSettings:
    return AgentSettings(
        host=host,
        driver="sysfs",
        sysfs_root=root,
        verbs={"events": "off"},
        routes={"apply": False},
        state_dir=tmp / "state",
        rail_map_path=tmp / "run" / "rail-map.json",
        metrics_listen=None,
    )


async def _run_agent(tmp: Path, root: Path, host: str) -> tuple[HostInventory, HostStatus]:
    """Start a real agent (sysfs driver, no ``ports:``) on ``root`` with an in-memory bus;
    its inventory and its retained status once the status is on the bus."""
    broker = MemoryBroker()
    agent = Agent(
        _agent_settings(tmp, root, host),
        table=MemoryRouteTable(),
        bus_factory=broker.bus_factory,
    )
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: topics.status(host) in broker.retained, "the agent's status")
        await until(lambda: topics.inventory(host) in broker.retained, "the agent's inventory")
        status = decode(HostStatus, broker.retained[topics.status(host)])
        inventory = decode(HostInventory, broker.retained[topics.inventory(host)])
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
    return inventory, status


async def test_agent_starts_on_the_h100_capture_without_ports(
    tmp_path: Path, fixtures_real: Path
) -> None:
    """The user's report: on a copy of the real H100 capture (no PCI `device` link) the agent
    starts without a single `ports:` line, its 8 InfiniBand ports the rails in name order."""
    root = tmp_path / "infiniband"
    shutil.copytree(fixtures_real / H100, root)
    with capture_logs() as logs:
        inventory, status = await _run_agent(tmp_path, root, "h100-01")
    assert [(h.hca, h.rail) for h in inventory.hcas] == [
        (f"mlx5_{n}", rail) for rail, n in enumerate((0, 1, 4, 5, 6, 7, 8, 9))
    ]
    assert status.online and status.device_problems is None
    assert [e["event"] for e in logs].count("rails_ordered_by_name") == 1


async def test_agent_status_names_the_lag_misconfiguration(sys_tree: Path) -> None:
    """On the all-Ethernet copy with ``bond1`` formed over mlx5_5's and mlx5_6's netdevs but
    no LAG device: the agent starts with 7 rails (the bond one of them), and its retained
    status names both misconfigured devices (HostStatus.device_problems)."""
    net = net_root(sys_tree)
    assert net is not None
    roce_host(sys_tree, net)
    inventory, status = await _run_agent(sys_tree.parents[2], sys_tree, "roce-01")
    assert [h.hca for h in inventory.hcas][-1] == "mlx5_bond_0" and len(inventory.hcas) == 7
    assert status.device_problems is not None
    assert [p.split(":")[0] for p in status.device_problems] == ["mlx5_5/1", "mlx5_6/1"]
