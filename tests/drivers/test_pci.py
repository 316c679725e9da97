"""The PCI sysfs driver on a tree built in a temporary directory the way the kernel lays it out:
``bus/pci/devices/<bdf>`` symlinks (``../../../devices/pci0000:00/...``) into the device tree,
with class, vendor, numa_node, infiniband/ and physfn as sysfs has them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.drivers import pci
from linkguard.drivers.pci import read_pci_layout
from linkguard.layout import Affinity, HostLayout, parse_nccl_topo

# the host: two sockets, one PCIe switch each
#   socket 0: root port 00:01.0 -> switch 01:00.0 -> ports 02:00.0 (GPU 03:00.0),
#             02:01.0 (HCA 04:00.0 mlx5_0, with an SR-IOV VF 04:00.2), 02:02.0 (HCA 05:00.0 mlx5_1)
#             root port 00:02.0 -> HCA 06:00.0 mlx5_4 (no switch)
#             root port 00:1c.0 -> BMC VGA 07:00.0 (ASPEED), management NIC 08:00.0 (no RDMA)
#   socket 1: root port 80:01.0 -> switch 81:00.0 -> ports 82:00.0 (GPU 83:00.0, numa_node
#             garbage), 82:01.0 (RoCE HCA 84:00.0 mlx5_2), 82:02.0 (HCA 85:00.0 mlx5_3)
BRIDGE, GPU3D, VGA, IB, ETH = "0x060400", "0x030200", "0x030000", "0x020700", "0x020000"
S0 = "pci0000:00/0000:00:01.0/0000:01:00.0"  # socket 0's switch (upstream port)
S1 = "pci0000:80/0000:80:01.0/0000:81:00.0"  # socket 1's
DEVICES: list[tuple[str, str, str, str, str | None]] = [
    # path below devices/, class, vendor, numa_node, RDMA device
    ("pci0000:00/0000:00:01.0", BRIDGE, "0x8086", "0", None),
    (S0, BRIDGE, "0x1000", "0", None),
    (f"{S0}/0000:02:00.0", BRIDGE, "0x1000", "0", None),
    (f"{S0}/0000:02:00.0/0000:03:00.0", GPU3D, "0x10de", "0", None),
    (f"{S0}/0000:02:01.0", BRIDGE, "0x1000", "0", None),
    (f"{S0}/0000:02:01.0/0000:04:00.0", IB, "0x15b3", "0", "mlx5_0"),
    (f"{S0}/0000:02:01.0/0000:04:00.2", IB, "0x15b3", "0", "mlx5_9"),
    (f"{S0}/0000:02:02.0", BRIDGE, "0x1000", "0", None),
    (f"{S0}/0000:02:02.0/0000:05:00.0", IB, "0x15b3", "0", "mlx5_1"),
    ("pci0000:00/0000:00:02.0", BRIDGE, "0x8086", "0", None),
    ("pci0000:00/0000:00:02.0/0000:06:00.0", IB, "0x15b3", "0", "mlx5_4"),
    ("pci0000:00/0000:00:1c.0", BRIDGE, "0x8086", "0", None),
    ("pci0000:00/0000:00:1c.0/0000:07:00.0", VGA, "0x1a03", "0", None),
    ("pci0000:00/0000:00:1c.0/0000:08:00.0", ETH, "0x14e4", "0", None),
    ("pci0000:80/0000:80:01.0", BRIDGE, "0x8086", "1", None),
    (S1, BRIDGE, "0x1000", "1", None),
    (f"{S1}/0000:82:00.0", BRIDGE, "0x1000", "1", None),
    (f"{S1}/0000:82:00.0/0000:83:00.0", GPU3D, "0x10de", "x1", None),
    (f"{S1}/0000:82:01.0", BRIDGE, "0x1000", "1", None),
    (f"{S1}/0000:82:01.0/0000:84:00.0", ETH, "0x15b3", "1", "mlx5_2"),
    (f"{S1}/0000:82:02.0", BRIDGE, "0x1000", "1", None),
    (f"{S1}/0000:82:02.0/0000:85:00.0", IB, "0x15b3", "-1", "mlx5_3"),
]  # fmt: skip


def build_tree(root: Path, devices=DEVICES) -> Path:
    """A PCI sysfs tree under ``root`` (the ``/sys`` of the test)."""
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for path, cls, vendor, numa, rdma in devices:
        d = root / "devices" / path
        d.mkdir(parents=True, exist_ok=True)
        (d / "class").write_text(cls + "\n")
        (d / "vendor").write_text(vendor + "\n")
        (d / "numa_node").write_text(numa + "\n")
        if rdma:
            (d / "infiniband" / rdma).mkdir(parents=True)
        bdf = path.rsplit("/", 1)[1]
        os.symlink(f"../../../devices/{path}", links / bdf)  # as the kernel links them
    vf = root / "devices" / DEVICES[6][0]
    os.symlink("../0000:04:00.0", vf / "physfn")
    return root


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no problem logged yet (the driver logs each one once)."""
    monkeypatch.setattr(pci, "_logged", set())


def test_gpus_and_hcas_with_switch_numa_and_bridges(tmp_path: Path) -> None:
    lay = read_pci_layout(build_tree(tmp_path / "sys"))
    assert [(g.index, g.bdf, g.numa, g.switch) for g in lay.gpus] == [
        (0, "0000:03:00.0", 0, "0000:01:00.0"),
        (1, "0000:83:00.0", None, "0000:81:00.0"),  # numa_node garbage: unknown, kept
    ]
    assert lay.gpus[0].bridges == ("0000:01:00.0", "0000:02:00.0")
    # the VF, the BMC's VGA and the Ethernet NIC without RDMA are left out
    assert [(n.index, n.name, n.bdf, n.numa, n.switch) for n in lay.nics] == [
        (0, "mlx5_0", "0000:04:00.0", 0, "0000:01:00.0"),
        (1, "mlx5_1", "0000:05:00.0", 0, "0000:01:00.0"),
        (2, "mlx5_4", "0000:06:00.0", 0, None),  # on a root port: no switch
        (3, "mlx5_2", "0000:84:00.0", 1, "0000:81:00.0"),  # RoCE: Ethernet class with RDMA
        (4, "mlx5_3", "0000:85:00.0", None, "0000:81:00.0"),  # numa_node -1: no affinity
    ]
    assert lay.problems == ("0000:83:00.0/numa_node: unparsable 'x1'",)
    assert lay.source == str(tmp_path / "sys")


def test_nearest_nics_switch_then_numa_then_any(tmp_path: Path) -> None:
    lay = read_pci_layout(build_tree(tmp_path / "sys"))
    # GPU 0: both HCAs of its switch, then the NUMA-local one on a root port, then socket 1
    assert [n.name for n in lay.nearest_nics(0)] == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_4",
        "mlx5_2",
        "mlx5_3",
    ]
    assert [lay.affinity(lay.gpu(0), n) for n in lay.nearest_nics(0)] == [
        Affinity.SWITCH, Affinity.SWITCH, Affinity.NUMA, Affinity.ANY, Affinity.ANY,
    ]  # fmt: skip
    # GPU 1 (NUMA unknown): its switch's HCAs still first; the rest is "any", by index
    assert [n.name for n in lay.nearest_nics("0000:83:00.0")] == [
        "mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1", "mlx5_4",
    ]  # fmt: skip
    assert [n.name for n in lay.local_nics(1)] == ["mlx5_2", "mlx5_3"]


def test_same_layout_as_an_nccl_file_of_the_same_host(tmp_path: Path) -> None:
    """The switch id is the same bus id from sysfs and from NCCL's XML (which writes each
    switch as its upstream port, root and downstream ports left out)."""
    sysfs = read_pci_layout(build_tree(tmp_path / "sys"))
    xml = parse_nccl_topo("""<system version="1">
      <cpu numaid="0">
        <pci busid="0000:01:00.0" class="0x060400">
          <pci busid="0000:03:00.0" class="0x030200"><gpu dev="0"/></pci>
          <pci busid="0000:04:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0"/></nic></pci>
          <pci busid="0000:05:00.0" class="0x020700"><nic><net name="mlx5_1" dev="1"/></nic></pci>
        </pci>
        <pci busid="0000:06:00.0" class="0x020700"><nic><net name="mlx5_4" dev="2"/></nic></pci>
      </cpu>
      <cpu numaid="1">
        <pci busid="0000:81:00.0" class="0x060400">
          <pci busid="0000:83:00.0" class="0x030200"><gpu dev="1"/></pci>
          <pci busid="0000:84:00.0" class="0x020000"><nic><net name="mlx5_2" dev="3"/></nic></pci>
          <pci busid="0000:85:00.0" class="0x020700"><nic><net name="mlx5_3" dev="4"/></nic></pci>
        </pci>
      </cpu></system>""")
    for a, b in zip(sysfs.nics, xml.nics, strict=True):
        assert (a.name, a.bdf, a.switch) == (b.name, b.bdf, b.switch)
    for a, b in zip(sysfs.gpus, xml.gpus, strict=True):
        assert (a.bdf, a.switch) == (b.bdf, b.switch)
        assert [n.name for n in sysfs.local_nics(a)] == [n.name for n in xml.local_nics(b)]


def test_bad_files_are_logged_once_and_never_crash(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "sys")
    dev = root / "devices"
    links = root / "bus" / "pci" / "devices"
    # GPU 0's numa_node is a directory (EISDIR), mlx5_1's is missing, mlx5_4's class empty
    gpu0 = dev / DEVICES[3][0]
    (gpu0 / "numa_node").unlink()
    (gpu0 / "numa_node").mkdir()
    (dev / DEVICES[8][0] / "numa_node").unlink()
    (dev / DEVICES[10][0] / "class").write_text("")
    # mlx5_3's link points nowhere; a link loop; a plain directory; a non-bdf entry
    (links / "0000:85:00.0").unlink()
    os.symlink("../../../devices/pci0000:80/gone/0000:85:00.0", links / "0000:85:00.0")
    os.symlink("0000:99:00.1", links / "0000:99:00.0")
    os.symlink("0000:99:00.0", links / "0000:99:00.1")
    (links / "0000:98:00.0").mkdir()
    (links / "0000:98:00.0" / "class").write_text("0x020700\n")
    (links / "not-a-device").mkdir()
    with capture_logs() as first:
        lay = read_pci_layout(root)
    assert [(g.bdf, g.numa, g.switch) for g in lay.gpus] == [
        ("0000:03:00.0", None, "0000:01:00.0"),
        ("0000:83:00.0", None, "0000:81:00.0"),
    ]
    assert [(n.bdf, n.name, n.numa, n.switch) for n in lay.nics] == [
        ("0000:04:00.0", "mlx5_0", 0, "0000:01:00.0"),
        ("0000:05:00.0", "mlx5_1", None, "0000:01:00.0"),
        ("0000:84:00.0", "mlx5_2", 1, "0000:81:00.0"),
        ("0000:98:00.0", None, None, None),  # kept: class readable, the rest unknown
    ]
    problems = set(lay.problems)
    assert "0000:03:00.0/numa_node: Is a directory" in problems
    assert "0000:05:00.0/numa_node: missing" in problems
    assert "0000:06:00.0/class: empty" in problems
    assert "0000:83:00.0/numa_node: unparsable 'x1'" in problems
    assert any(p.startswith("0000:85:00.0/class: ") for p in problems)  # dangling link
    assert any(p.startswith("0000:99:00.0/class: ") for p in problems)  # loop
    assert any(p.startswith("0000:98:00.0: device path") for p in problems)
    assert [e["problem"] for e in first if e["event"] == "pci_bad_value"] == list(lay.problems)
    with capture_logs() as second:
        again = read_pci_layout(root)
    assert again == lay  # same result, nothing logged twice
    assert [e for e in second if e["event"] == "pci_bad_value"] == []


def test_no_pci_tree_is_an_empty_layout(tmp_path: Path) -> None:
    lay = read_pci_layout(tmp_path / "nothing")
    assert (lay.gpus, lay.nics) == ((), ())
    assert len(lay.problems) == 1 and "No such file or directory" in lay.problems[0]


def test_this_hosts_sysfs_reads_without_error() -> None:
    """The real /sys of this machine (no GPU here; maybe none, maybe an RDMA NIC)."""
    if not os.path.isdir("/sys/bus/pci/devices"):
        pytest.skip("no /sys/bus/pci on this machine")
    lay = read_pci_layout()
    assert isinstance(lay, HostLayout) and lay.source == "/sys"
    for d in (*lay.gpus, *lay.nics):
        assert d.bdf is not None and os.path.exists(f"/sys/bus/pci/devices/{d.bdf}")
