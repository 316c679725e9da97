"""``linkguard layout`` (the host's GPU-NIC layout from a PCI sysfs tree or an NCCL topology
file) and ``linkguard fabric generate --rails-per-pcie-switch``: on a PCI tree built in a
temporary directory (tests/drivers/test_pci.py's builder) and on the real aws-ofi-nccl files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from linkguard.cli import main
from linkguard.topology.fabric import load_fabric
from linkguard.topology.generator import generate_rail_optimized
from tests.conftest import FIXTURES
from tests.drivers.test_pci import build_tree

P4D, P5 = "p4d-24xl-topo.xml", "p5.48xl-topo.xml"


@pytest.fixture
def sysroot(tmp_path: Path) -> Path:
    """A root whose sys/bus/pci/devices is the two-socket host of test_pci.py."""
    build_tree(tmp_path / "root" / "sys")
    return tmp_path / "root"


def _xml(tmp_path: Path, name: str) -> Path:
    """A copy of a real NCCL topology file (the fixture itself is never touched)."""
    src = FIXTURES / "aws-ofi-nccl" / name
    if not src.is_file():
        pytest.fail(f"real fixture {src} missing (set LINKGUARD_FIXTURES)")
    return Path(shutil.copy(src, tmp_path / name))


def _json(capsys, *argv: str) -> dict:
    assert main(["layout", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_text_from_a_pci_tree(sysroot: Path, capsys) -> None:
    # --sysfs is the root the tree is under (ROOT/sys), or the sysfs mount itself
    for root in (sysroot, sysroot / "sys"):
        assert main(["layout", "--sysfs", str(root)]) == 0
        assert capsys.readouterr().out == (
            f"# {sysroot / 'sys'}: 2 GPU(s), 5 NIC(s)\n"
            "GPU  BDF           NUMA  PCIE_SWITCH   NEAREST_NICS\n"
            "0    0000:03:00.0  0     0000:01:00.0  mlx5_0(switch) mlx5_1(switch) mlx5_4(numa) "
            "mlx5_2(any) mlx5_3(any)\n"
            "1    0000:83:00.0  -     0000:81:00.0  mlx5_2(switch) mlx5_3(switch) mlx5_0(any) "
            "mlx5_1(any) mlx5_4(any)\n"
            "# unreadable: 0000:83:00.0/numa_node: unparsable 'x1'\n"
        )


def test_json_from_a_pci_tree(sysroot: Path, capsys) -> None:
    doc = _json(capsys, "--sysfs", str(sysroot))
    g0, g1 = doc["gpus"]
    assert (g0["index"], g0["bdf"], g0["numa"], g0["pcie_switch"]) == (
        0, "0000:03:00.0", 0, "0000:01:00.0",
    )  # fmt: skip
    assert [(n["nic"], n["bdf"], n["affinity"]) for n in g0["nearest_nics"]] == [
        ("mlx5_0", "0000:04:00.0", "switch"),
        ("mlx5_1", "0000:05:00.0", "switch"),
        ("mlx5_4", "0000:06:00.0", "numa"),  # NUMA-local, on a root port
        ("mlx5_2", "0000:84:00.0", "any"),
        ("mlx5_3", "0000:85:00.0", "any"),
    ]
    assert (g1["numa"], g1["pcie_switch"]) == (None, "0000:81:00.0")
    assert [n["affinity"] for n in g1["nearest_nics"]] == ["switch", "switch", "any", "any", "any"]
    assert [(n["name"], n["pcie_switch"]) for n in doc["nics"]] == [
        ("mlx5_0", "0000:01:00.0"),
        ("mlx5_1", "0000:01:00.0"),
        ("mlx5_4", None),
        ("mlx5_2", "0000:81:00.0"),
        ("mlx5_3", "0000:81:00.0"),
    ]
    assert doc["problems"] == ["0000:83:00.0/numa_node: unparsable 'x1'"]


def test_fabric_fragment_goes_into_a_fabric_file(sysroot: Path, tmp_path: Path, capsys) -> None:
    """The fragment's switch ids, merged into a generated host with the same HCA names, make
    a fabric file that loads (each switch on one NUMA node) with the host's layout."""
    assert main(["layout", "--sysfs", str(sysroot), "--format", "fabric"]) == 0
    frag = yaml.safe_load(capsys.readouterr().out)
    assert frag["gpu_pcie_switch"] == ["0000:01:00.0", "0000:81:00.0"]
    assert frag["gpu_numa"] == [0, None]
    assert [(h["hca"], h["port"], h["pci_address"], h["pcie_switch"]) for h in frag["hcas"]] == [
        ("mlx5_0", 1, "0000:04:00.0", "0000:01:00.0"),
        ("mlx5_1", 1, "0000:05:00.0", "0000:01:00.0"),
        ("mlx5_4", 1, "0000:06:00.0", None),
        ("mlx5_2", 1, "0000:84:00.0", "0000:81:00.0"),
        ("mlx5_3", 1, "0000:85:00.0", "0000:81:00.0"),
    ]
    doc = generate_rail_optimized(hosts=2, rails=4, gpus_per_host=2).model_dump(mode="json")
    switch = {h["hca"]: h["pcie_switch"] for h in frag["hcas"]}
    host = doc["hosts"][0]
    for hca in host["hcas"]:
        hca["pcie_switch"] = switch[hca["hca"]]
    host["gpu_pcie_switch"] = frag["gpu_pcie_switch"]
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fabric(path).host("gpu000")
    assert [h.pcie_switch for h in loaded.hcas] == [
        "0000:01:00.0", "0000:01:00.0", "0000:81:00.0", "0000:81:00.0",
    ]  # fmt: skip
    assert loaded.gpu_pcie_switch == ["0000:01:00.0", "0000:81:00.0"]


def test_p4d_file_one_nic_per_two_gpus(tmp_path: Path, capsys) -> None:
    """p4d.24xlarge: 4 switches, each with 2 A100s and 1 EFA NIC (bare <pci>, no names)."""
    doc = _json(capsys, "--nccl-topo", str(_xml(tmp_path, P4D)))
    assert len(doc["gpus"]) == 8 and len(doc["nics"]) == 4
    nics = ["0000:10:1b.0", "0000:20:1b.0", "0000:90:1b.0", "0000:a0:1b.0"]
    for g in doc["gpus"]:
        nearest = [(n["nic"], n["affinity"]) for n in g["nearest_nics"]]
        own = nics[g["index"] // 2]
        sibling = nics[(g["index"] // 2) ^ 1]  # the other switch of the same socket
        assert nearest[:2] == [(own, "switch"), (sibling, "numa")]
        assert [a for _, a in nearest[2:]] == ["any", "any"]
        assert g["numa"] == g["index"] // 4
    assert [g["pcie_switch"] for g in doc["gpus"]] == [
        s for s in ("ffff:ff:01.0", "ffff:ff:02.0", "ffff:ff:03.0", "ffff:ff:04.0") for _ in "ab"
    ]
    assert main(["layout", "--nccl-topo", str(tmp_path / P4D), "--format", "fabric"]) == 0
    frag = yaml.safe_load(capsys.readouterr().out)
    assert frag["hcas"][0] == {
        "pci_address": "0000:10:1b.0",
        "pcie_switch": "ffff:ff:01.0",
        "numa_node": 0,
    }  # a nameless NIC: no hca/port keys


def test_p5_file_four_nics_per_gpu(tmp_path: Path, capsys) -> None:
    """p5.48xlarge: each H100 with 4 EFA NICs on its switch; one NUMA node for all."""
    doc = _json(capsys, "--nccl-topo", str(_xml(tmp_path, P5)))
    assert len(doc["gpus"]) == 8 and len(doc["nics"]) == 32
    g0 = doc["gpus"][0]
    assert (g0["bdf"], g0["numa"], g0["pcie_switch"]) == ("0000:4f:00.0", 0, "0000:00:00.0")
    assert [(n["nic"], n["affinity"]) for n in g0["nearest_nics"][:5]] == [
        ("rdmap79s0", "switch"),
        ("rdmap80s0", "switch"),
        ("rdmap81s0", "switch"),
        ("rdmap82s0", "switch"),
        ("rdmap96s0", "numa"),
    ]
    for g in doc["gpus"]:
        tiers = [n["affinity"] for n in g["nearest_nics"]]
        assert tiers == ["switch"] * 4 + ["numa"] * 28
    g7 = doc["gpus"][7]
    assert [n["nic"] for n in g7["nearest_nics"][:4]] == [
        "rdmap198s0", "rdmap199s0", "rdmap200s0", "rdmap201s0",
    ]  # fmt: skip


def test_no_gpu_is_exit_1(tmp_path: Path, capsys) -> None:
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    assert main(["layout", "--sysfs", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"linkguard: no GPU found in {tmp_path / 'sys'} (0 RDMA NIC(s)): nothing to lay out; "
        "give --nccl-topo FILE or --sysfs ROOT of a GPU host\n"
    )
    # a root with no PCI tree at all: the same, not a crash
    assert main(["layout", "--sysfs", str(tmp_path / "absent")]) == 1
    assert "no GPU found in" in capsys.readouterr().err


def test_bad_xml_is_exit_2_with_the_reason(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.xml"
    data = _xml(tmp_path, P5).read_bytes()
    bad.write_bytes(data.replace(b'numaid="0"', b'numaid="zero"', 1))
    assert main(["layout", "--nccl-topo", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"linkguard: {bad}: <cpu> has numaid='zero', not an integer\n"
    )
    bad.write_bytes(b'<!DOCTYPE x [<!ENTITY a "b">]><system>&a;</system>')
    assert main(["layout", "--nccl-topo", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"linkguard: {bad}: refused: ")
    assert main(["layout", "--nccl-topo", str(tmp_path / "none.xml")]) == 2
    assert "cannot read NCCL topology file" in capsys.readouterr().err


def test_generate_rails_per_pcie_switch(tmp_path: Path, capsys) -> None:
    path = tmp_path / "f.yaml"
    argv = ["fabric", "generate", "--hosts", "2", "--rails", "8", "-o", str(path)]
    assert main([*argv, "--rails-per-pcie-switch", "2"]) == 0
    host = load_fabric(path).host("gpu001")
    assert [h.pcie_switch for h in host.hcas] == [f"pcie{r // 2}" for r in range(8)]
    assert host.gpu_pcie_switch == [f"pcie{g // 2}" for g in range(8)]
    assert main(argv) == 0  # default 0: no switch ids
    assert {h.pcie_switch for h in load_fabric(path).host("gpu001").hcas} == {None}
    # 3 does not divide the 4 rails of a NUMA node: the generator's error, exit 2
    assert main([*argv, "--rails-per-pcie-switch", "3"]) == 2
    assert "rails_per_pcie_switch=3 puts rails 3 and 4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--rails-per-pcie-switch", "-1"])
    assert exc.value.code == 2
    # like every generator option: with show/export only together with --generate
    with pytest.raises(SystemExit):
        main(["fabric", "show", "--fabric", str(path), "--rails-per-pcie-switch", "2"])
    assert "--rails-per-pcie-switch: generator options need --generate" in (capsys.readouterr().err)


def test_help_names_the_new_options(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["fabric", "generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rails-per-pcie-switch K" in text and "(default 0: no switch ids)" in text
    with pytest.raises(SystemExit):
        main(["layout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for want in ("--sysfs ROOT", "--nccl-topo FILE", "{text,json,fabric}", "1 no GPU found"):
        assert want in text


def test_fabric_fragment_refuses_a_gpu_index_beyond_64(tmp_path: Path, capsys) -> None:
    """Found by the fuzzer: ``<gpu dev="99999999999">`` made a positional list that long
    (MemoryError); a fabric file's host has at most 64 GPUs."""
    xml = tmp_path / "t.xml"
    xml.write_text(
        '<system><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200">'
        '<gpu dev="99999999999"/></pci></cpu></system>'
    )
    assert main(["layout", "--nccl-topo", str(xml), "--format", "fabric"]) == 2
    assert capsys.readouterr().err == (
        f"linkguard: {xml}: GPU index 99999999999: a fabric file's host has at most 64 GPUs\n"
    )
    assert main(["layout", "--nccl-topo", str(xml)]) == 0  # the text view has no such limit
    assert "99999999999  0000:01:00.0  0" in capsys.readouterr().out
