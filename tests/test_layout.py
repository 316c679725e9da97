"""Host layout: GPU-NIC affinity from the real NCCL topology files (aws-ofi-nccl's p4d and p5),
hostile and malformed XML refused with LayoutError, and the layout copied into an inventory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkguard.layout import (
    MAX_TOPO_BYTES,
    Affinity,
    HostLayout,
    LayoutError,
    annotate_inventory,
    load_nccl_topo,
    parse_nccl_topo,
)
from linkguard.models import HCAInfo, HostInventory

P4D = "aws-ofi-nccl/p4d-24xl-topo.xml"
P5 = "aws-ofi-nccl/p5.48xl-topo.xml"
FIXTURES = Path(
    os.environ.get(
        "LINKGUARD_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
    )
)
#: the p5 file's text for the mangling property (read once)
P5_TEXT = (FIXTURES / P5).read_text() if (FIXTURES / P5).is_file() else None


def _copy(fixtures_real: Path, tmp_path: Path, rel: str) -> Path:
    dst = tmp_path / Path(rel).name
    shutil.copyfile(fixtures_real / rel, dst)
    return dst


@pytest.fixture
def p4d(fixtures_real: Path, tmp_path: Path) -> HostLayout:
    return load_nccl_topo(_copy(fixtures_real, tmp_path, P4D))


@pytest.fixture
def p5(fixtures_real: Path, tmp_path: Path) -> HostLayout:
    return load_nccl_topo(_copy(fixtures_real, tmp_path, P5))


def test_p4d_each_gpu_pair_nearest_to_the_nic_on_its_switch(p4d: HostLayout) -> None:
    """p4d.24xlarge: 2 CPUs, 4 switches, each 2 GPUs + 1 EFA NIC (the file's comments)."""
    assert [g.bdf for g in p4d.gpus] == [
        "0000:10:1c.0", "0000:10:1d.0", "0000:20:1c.0", "0000:20:1d.0",
        "0000:90:1c.0", "0000:90:1d.0", "0000:a0:1c.0", "0000:a0:1d.0",
    ]  # fmt: skip
    assert [n.bdf for n in p4d.nics] == [
        "0000:10:1b.0",
        "0000:20:1b.0",
        "0000:90:1b.0",
        "0000:a0:1b.0",
    ]
    assert all(n.name is None for n in p4d.nics)  # the file lists bare PCI functions
    assert [g.numa for g in p4d.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.numa for n in p4d.nics] == [0, 0, 1, 1]
    switches = ["ffff:ff:01.0", "ffff:ff:02.0", "ffff:ff:03.0", "ffff:ff:04.0"]
    assert [n.switch for n in p4d.nics] == switches
    for g in p4d.gpus:
        nic = g.index // 2  # GPU 0, 1 -> NIC 0; 2, 3 -> NIC 1; ...
        assert g.switch == switches[nic]
        order = p4d.nearest_nics(g.index)
        # the NIC on its switch, then the other NIC of its socket, then the far socket's two
        same_socket = nic ^ 1
        far = [2, 3] if nic < 2 else [0, 1]
        assert [n.index for n in order] == [nic, same_socket, *far]
        assert [p4d.affinity(g, n) for n in order] == [
            Affinity.SWITCH,
            Affinity.NUMA,
            Affinity.ANY,
            Affinity.ANY,
        ]
        assert p4d.local_nics(g.bdf) == [p4d.nics[nic]]


def test_p5_each_gpu_nearest_to_its_four_nics(p5: HostLayout) -> None:
    """p5.48xlarge: 8 switches, each with 1 H100 and 4 EFA NICs, all on NUMA node 0."""
    assert [g.index for g in p5.gpus] == list(range(8))
    assert [n.index for n in p5.nics] == list(range(32))
    first = [79, 96, 113, 130, 147, 164, 181, 198]  # rdmap<N>s0 of each switch's first NIC
    for g in p5.gpus:
        mine = [f"rdmap{first[g.index] + i}s0" for i in range(4)]
        order = p5.nearest_nics(g)
        assert [n.name for n in order[:4]] == mine
        assert [n.index for n in order[:4]] == [4 * g.index + i for i in range(4)]
        assert {p5.affinity(g, n) for n in order[:4]} == {Affinity.SWITCH}
        # every other NIC is NUMA-local (one socket's worth of PCIe), in dev order
        assert {p5.affinity(g, n) for n in order[4:]} == {Affinity.NUMA}
        assert [n.index for n in order[4:]] == [i for i in range(32) if i // 4 != g.index]
        assert [n.name for n in p5.local_nics(g.index)] == mine
        assert all(n.port == 1 and n.bdf is not None for n in order)
    assert p5.nic("rdmap97s0").bdf == "0000:62:00.0"
    assert p5.gpu("0000:4F:00.0").index == 0  # bus ids compare in lower case


def test_unknown_gpu_or_nic_is_a_layout_error(p5: HostLayout) -> None:
    with pytest.raises(LayoutError, match="no GPU 8"):
        p5.nearest_nics(8)
    with pytest.raises(LayoutError, match="no NIC 'mlx5_0'"):
        p5.nic("mlx5_0")


def test_nested_switches_prefer_the_deeper_common_bridge() -> None:
    """A two-level switch tree: the NIC under the GPU's own second-level switch comes before
    the one under the sibling switch; both are on the GPU's (top-level) switch."""
    xml = """<system version="1"><cpu numaid="1">
      <pci busid="0000:10:00.0" class="0x060400">
        <pci busid="0000:11:00.0" class="0x060400">
          <pci busid="0000:12:00.0" class="0x020700"><nic><net name="mlx5_a" dev="0"/></nic></pci>
        </pci>
        <pci busid="0000:21:00.0" class="0x060400">
          <pci busid="0000:22:00.0" class="0x030200"><gpu dev="0"/></pci>
          <pci busid="0000:23:00.0" class="0x020700"><nic><net name="mlx5_b" dev="1"/></nic></pci>
        </pci>
      </pci></cpu></system>"""
    lay = parse_nccl_topo(xml)
    g = lay.gpu(0)
    assert (g.switch, g.bridges, g.numa) == ("0000:10:00.0", ("0000:10:00.0", "0000:21:00.0"), 1)
    assert [n.name for n in lay.nearest_nics(0)] == ["mlx5_b", "mlx5_a"]
    assert [n.name for n in lay.local_nics(0)] == ["mlx5_b", "mlx5_a"]


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE system [
  <!ENTITY a "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa">
  <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
  <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
  <!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">
]>
<system version="1"><cpu numaid="&d;"/></system>"""

EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE system [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<system version="1"><cpu numaid="0"><nic><net name="&x;" dev="0"/></nic></cpu></system>"""

DTD_ONLY = """<?xml version="1.0"?>
<!DOCTYPE system SYSTEM "http://127.0.0.1:9/nccl.dtd">
<system version="1"/>"""


def _deep(levels: int) -> str:
    return (
        '<system version="1"><cpu numaid="0">'
        + "".join(f'<pci busid="0000:{i:02x}:00.0" class="0x060400">' for i in range(levels))
        + "</pci>" * levels
        + "</cpu></system>"
    )


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (BILLION_LAUGHS, "refused: EntitiesForbidden|refused: DTDForbidden"),
        (EXTERNAL, "refused: EntitiesForbidden|refused: DTDForbidden"),
        (DTD_ONLY, "refused: DTDForbidden"),
        ("<system><cpu numaid='0'>", "not well-formed"),
        (b"\xff\xfe<\x00s\x00", "not well-formed"),
        ("", "not well-formed"),
        ("<html><body/></html>", "root element is <html>, expected <system>"),
        (_deep(40), "nested deeper than 16"),
        ("<system><cpu numaid='zero'/></system>", "numaid='zero', not an integer"),
        ("<system><cpu numaid='4096'/></system>", "NUMA nodes are 0..1023"),
        (
            "<system><cpu numaid='0'><pci busid='../../etc' class='0x030200'/></cpu></system>",
            "not a PCI bus id",
        ),
        (
            "<system><cpu numaid='0'><pci busid='0000:01:00.0' class='GPU'/></cpu></system>",
            "class='GPU', not an integer",
        ),
        (
            "<system><cpu numaid='0'>"
            "<pci busid='0000:01:00.0' class='0x030200'><gpu dev='0'/></pci>"
            "<pci busid='0000:02:00.0' class='0x030200'><gpu dev='0'/></pci></cpu></system>",
            r"duplicate GPU dev \[0\]",
        ),
        (
            "<system><cpu numaid='0'>"
            "<pci busid='0000:01:00.0' class='0x030200'><gpu dev='1'/></pci>"
            "<pci busid='0000:02:00.0' class='0x030200'><gpu/></pci></cpu></system>",
            "some GPUs have a dev attribute and some do not",
        ),
        (
            "<system><cpu numaid='0'><nic><net name='m' dev='0' port='0'/></nic></cpu></system>",
            "port 0",
        ),
        ("<system><cpu numaid='0'><pci><cpu numaid='1'/></pci></cpu></system>", "<cpu> inside"),
    ],
)
def test_hostile_and_malformed_xml_is_a_layout_error(doc: str | bytes, match: str) -> None:
    with pytest.raises(LayoutError, match=match) as e:
        parse_nccl_topo(doc, source="topo.xml")
    assert str(e.value).startswith("topo.xml: ")


def test_oversized_and_unreadable_files(tmp_path: Path) -> None:
    big = tmp_path / "big.xml"
    big.write_bytes(b"<system>" + b" " * MAX_TOPO_BYTES + b"</system>")
    with pytest.raises(LayoutError, match=f"{big}: larger than"):
        load_nccl_topo(big)
    with pytest.raises(LayoutError, match="cannot read NCCL topology file"):
        load_nccl_topo(tmp_path / "missing.xml")
    with pytest.raises(LayoutError, match="cannot read NCCL topology file"):
        load_nccl_topo(tmp_path)  # a directory


def test_minimal_and_nicless_files() -> None:
    assert parse_nccl_topo('<system version="1"/>') == HostLayout(source="<nccl topo>")
    # a NIC straight under <cpu> (no PCI parent): NUMA-local, no switch
    lay = parse_nccl_topo(
        "<system><cpu numaid='-1'><pci busid='0000:01:00.0' class='0x030200'/>"
        "<nic><net name='eth0' dev='0'/></nic></cpu></system>"
    )
    assert (lay.gpus[0].numa, lay.gpus[0].switch) == (None, None)
    assert (lay.nics[0].name, lay.nics[0].bdf, lay.nics[0].switch) == ("eth0", None, None)
    assert lay.affinity(lay.gpus[0], lay.nics[0]) == Affinity.ANY  # NUMA unknown (-1)


def test_annotate_inventory_from_the_p5_file(p5: HostLayout) -> None:
    """A host with 8 of the p5's 32 NICs as rails, matched by PCI address (rails 0-3) and by
    name (rails 4-7); the GPUs get the switch and node of the layout's GPU of the same index."""
    hcas = [HCAInfo(hca=f"x{r}", rail=r, pci_address=p5.nics[r].bdf.upper()) for r in range(4)] + [
        HCAInfo(hca=p5.nics[r].name, rail=r) for r in range(4, 8)
    ]
    inv = HostInventory(
        host="p5-0",
        hcas=[*hcas, HCAInfo(hca="mlx5_9", rail=9)],
        endpoints=[f"10.0.0.{g + 1}" for g in range(9)],
    )
    out = annotate_inventory(inv, p5)
    assert [c.pcie_switch for c in out.hcas] == ["0000:00:00.0"] * 4 + ["0000:01:00.0"] * 4 + [None]
    assert [c.numa_node for c in out.hcas] == [0] * 8 + [None]
    assert out.gpu_pcie_switch == [f"0000:0{g}:00.0" for g in range(8)] + [None]  # GPU 8: none
    assert out.gpu_numa == [0] * 8 + [None]
    # a layout whose GPU indices match none of the endpoints is of another host type: refused
    other = HostLayout(gpus=(p5.gpus[7].model_copy(update={"index": 20}),), source="x.xml")
    with pytest.raises(LayoutError, match=r"x.xml: GPU indices \[20\] do not match"):
        annotate_inventory(inv, other)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 40), st.text(max_size=12)), max_size=6
    )
)
def test_mangled_real_file_gives_a_layout_or_a_layout_error(edits) -> None:
    """The p5 file with spans replaced by random text: a HostLayout or LayoutError, nothing
    else (no other exception type, no hang)."""
    if P5_TEXT is None:
        pytest.fail(f"real fixture {FIXTURES / P5} not found (set LINKGUARD_FIXTURES)")
    text = P5_TEXT
    for at, cut, new in edits:
        at %= len(text) + 1
        text = text[:at] + new + text[at + cut :]
    try:
        lay = parse_nccl_topo(text)
    except LayoutError:
        return
    assert isinstance(lay, HostLayout)
    for g in lay.gpus:
        lay.nearest_nics(g)
