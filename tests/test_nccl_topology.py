"""NCCL topology XML without the unusable NICs (linkguard.nccl.render_topology), on the real
aws-ofi-nccl files (../shared/fixtures/real/aws-ofi-nccl: p4d, 8 GPUs and 4 bare NIC ``<pci>``
elements; p5, 8 GPUs and 32 ``<nic><net>`` NICs), and hostile or broken XML."""

from __future__ import annotations

import difflib
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from linkguard.models import HCAInfo, HostInventory, PortState, PortStatus
from linkguard.nccl import (
    MAX_TOPOLOGY_BYTES,
    MAX_TOPOLOGY_DEPTH,
    PortVerdict,
    TopologyFileError,
    port_verdicts,
    render_topology,
)

REAL = Path(__file__).resolve().parents[2] / "shared/fixtures/real/aws-ofi-nccl"


def _down(hca: str, bdf: str) -> PortVerdict:
    """Port 1 of ``hca`` (PCI address ``bdf``) down, unusable."""
    return PortVerdict(
        hca=hca, port=1, rail=0, link_layer="infiniband", numa_node=None, pcie_switch=None,
        pci_address=bdf, usable=False, why="down", rate_gbps=None, expected_gbps=None,
    )  # fmt: skip


def _source(name: str) -> str:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"real fixture missing: {path}")
    return path.read_text()


def _verdicts(inv: HostInventory, down: set[str]) -> list[PortVerdict]:
    states = [
        PortState(
            host=inv.host,
            hca=h.hca,
            port=h.port,
            rail=h.rail,
            status=PortStatus.HELD_DOWN if h.hca in down else PortStatus.UP,
            usable=h.hca not in down,
            rate_gbps=100.0,
            observed_at=1.0,
        )
        for h in inv.hcas
    ]
    return port_verdicts(inv, states)


def _p4d() -> tuple[str, HostInventory]:
    """p4d: the NICs have no names in the file, only bus ids: the inventory's PCI addresses."""
    src = _source("p4d-24xl-topo.xml")
    busids = ["0000:10:1b.0", "0000:20:1b.0", "0000:90:1b.0", "0000:a0:1b.0"]
    inv = HostInventory(
        host="p4d",
        hcas=[HCAInfo(hca=f"efa{i}", rail=i, pci_address=b) for i, b in enumerate(busids)],
    )
    return src, inv


def _p5() -> tuple[str, HostInventory]:
    src = _source("p5.48xl-topo.xml")
    nets = [(n.get("name"), int(n.get("dev", "-1"))) for n in ET.fromstring(src).iter("net")]
    assert len(nets) == 32
    inv = HostInventory(host="p5", hcas=[HCAInfo(hca=str(n), rail=d) for n, d in nets])
    return src, inv


def _changes(src: str, out: str) -> tuple[list[str], list[str]]:
    """Lines removed from and added to ``src`` (whitespace and all)."""
    diff = list(difflib.ndiff(src.splitlines(), out.splitlines()))
    return [d[2:] for d in diff if d.startswith("- ")], [d[2:] for d in diff if d.startswith("+ ")]


def _gpus_and_nics(xml: str) -> tuple[list[str], list[str]]:
    root = ET.fromstring(xml)  # still parses
    assert root.tag == "system" and root.get("version") == "1"
    gpus = [
        p.get("busid", "")
        for p in root.iter("pci")
        if p.find("gpu") is not None or (p.get("class") == "0x030200" and len(p) == 0)
    ]
    nics = [n.get("name", "") for n in root.iter("net")] + [
        p.get("busid", "") for p in root.iter("pci") if p.get("class") == "0x020000" and len(p) == 0
    ]
    for nic in root.iter("nic"):  # no wrapper left empty
        assert len(nic) > 0
    for pci in root.iter("pci"):
        assert len(pci) > 0 or pci.get("class") in ("0x030200", "0x020000")
    return gpus, nics


@pytest.mark.parametrize("loader", [_p4d, _p5], ids=["p4d", "p5"])
def test_nothing_unusable_gives_the_file_back_byte_for_byte(loader) -> None:
    src, inv = loader()
    r = render_topology(src, _verdicts(inv, set()))
    assert r.xml == src
    assert r.removed == () and r.not_found == () and r.gpus == 8


def test_p4d_one_and_two_nics_removed() -> None:
    src, inv = _p4d()
    r = render_topology(src, _verdicts(inv, {"efa1"}))
    assert r.removed == ("efa1/1",)
    gpus, nics = _gpus_and_nics(r.xml)
    assert len(gpus) == 8 == r.gpus
    assert nics == ["0000:10:1b.0", "0000:90:1b.0", "0000:a0:1b.0"] == list(r.nics)
    removed, added = _changes(src, r.xml)
    assert added == ["<!-- linkguard: removed efa1:1 (held_down) -->"]
    # exactly the NIC's line, with its "NIC 1" comment; switch 1 keeps its two GPUs
    assert len(removed) == 1 and 'busid="0000:20:1b.0"' in removed[0]
    assert removed[0].endswith("<!-- NIC 1 -->")

    r = render_topology(src, _verdicts(inv, {"efa1", "efa3"}))
    assert r.removed == ("efa1/1", "efa3/1")
    gpus, nics = _gpus_and_nics(r.xml)
    assert len(gpus) == 8 and nics == ["0000:10:1b.0", "0000:90:1b.0"]
    removed, added = _changes(src, r.xml)
    assert added == ["<!-- linkguard: removed efa1:1 (held_down), efa3:1 (held_down) -->"]
    assert [line.strip()[-14:] for line in removed] == ["<!-- NIC 1 -->", "<!-- NIC 3 -->"]


def test_p5_one_and_two_nics_removed() -> None:
    src, inv = _p5()
    r = render_topology(src, _verdicts(inv, {"rdmap80s0"}))
    assert r.removed == ("rdmap80s0/1",)
    gpus, nics = _gpus_and_nics(r.xml)
    assert len(gpus) == 8
    assert len(nics) == 31 and "rdmap80s0" not in nics and "rdmap79s0" in nics
    removed, added = _changes(src, r.xml)
    assert added == ["<!-- linkguard: removed rdmap80s0:1 (held_down) -->"]
    # its <pci> (bus 0000:51:00.0) with the <nic> and <net> inside: five lines, nothing else
    assert sorted(x.strip() for x in removed) == sorted(
        [
            '<pci busid="0000:51:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" '
            'link_width="8">',
            "<nic>",
            '<net name="rdmap80s0" dev="1" speed="100000" port="1" latency="0.0" guid="1" '
            'maxconn="1024" gdr="1"/>',
            "</nic>",
            "</pci>",
        ]
    )
    assert 'busid="0000:51:00.0"' not in r.xml

    r = render_topology(src, _verdicts(inv, {"rdmap80s0", "rdmap113s0"}))
    gpus, nics = _gpus_and_nics(r.xml)
    assert len(gpus) == 8 and len(nics) == 30
    assert "rdmap113s0" not in nics and r.removed == ("rdmap80s0/1", "rdmap113s0/1")
    removed, _ = _changes(src, r.xml)
    assert len(removed) == 10
    # each GPU keeps its place: GPU 0 and 2 still under the switches they were under
    root = ET.fromstring(r.xml)
    switches = [p for p in root.iter("pci") if p.get("class") == "0x060400"]
    assert [s.find("pci/gpu").get("dev") for s in switches] == [str(i) for i in range(8)]
    assert [len(s.findall("pci/nic")) for s in switches] == [3, 4, 3, 4, 4, 4, 4, 4]


def test_one_port_of_a_dual_port_nic() -> None:
    src = """<system version="1">
  <cpu numaid="0">
    <pci busid="0000:18:00.0" class="0x020700">
      <nic>
        <net name="mlx5_0" dev="0" port="1"/>
        <net name="mlx5_0" dev="1" port="2"/>
      </nic>
    </pci>
  </cpu>
</system>
"""
    inv = HostInventory(host="h", hcas=[HCAInfo(hca="mlx5_0", port=p, rail=p - 1) for p in (1, 2)])
    states = [
        PortState(host="h", hca="mlx5_0", port=1, status=PortStatus.UP, usable=True, observed_at=1),
        PortState(host="h", hca="mlx5_0", port=2, status=PortStatus.DOWN, observed_at=1),
    ]
    r = render_topology(src, port_verdicts(inv, states))
    assert r.removed == ("mlx5_0/2",) and r.nics == ("mlx5_0",)
    assert r.xml == (
        "<!-- linkguard: removed mlx5_0:2 (down) -->\n"
        + src.replace('        <net name="mlx5_0" dev="1" port="2"/>\n', "")
    )
    # an unusable port the file does not list is reported, not an error
    inv = HostInventory(host="h", hcas=[HCAInfo(hca="mlx5_9", rail=0)])
    st = PortState(host="h", hca="mlx5_9", port=1, status=PortStatus.DOWN, observed_at=1)
    r = render_topology(src, port_verdicts(inv, [st]))
    assert r.removed == () and r.not_found == ("mlx5_9/1",) and r.xml == src


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        (
            '<?xml version="1.0"?><!DOCTYPE s [<!ENTITY a "xxxxxxxxxx"><!ENTITY b "&a;&a;&a;">]>'
            "<system>&b;</system>",
            "refused: DTDForbidden",
        ),
        (
            '<!DOCTYPE system [<!ENTITY x SYSTEM "file:///etc/passwd">]><system>&x;</system>',
            "refused: DTDForbidden",
        ),
        ("<system><cpu></system>", "not well-formed XML: mismatched tag"),
        ("", "not well-formed XML: no element found"),
        ('<graphs version="1"/>', "root element <graphs>, expected <system>"),
        ("<system>" + " " * MAX_TOPOLOGY_BYTES + "</system>", f"larger than {MAX_TOPOLOGY_BYTES}"),
        # 100,000 levels would blow Python's recursion when written back out
        ("<system>" + "<pci>" * 100_000, f"nested deeper than {MAX_TOPOLOGY_DEPTH}"),
    ],
    ids=[
        "billion-laughs",
        "external-entity",
        "mismatched",
        "empty",
        "wrong-root",
        "too-large",
        "too-deep",
    ],
)
def test_hostile_or_broken_xml_is_a_clear_error(xml: str, message: str) -> None:
    with pytest.raises(TopologyFileError, match=message) as exc:
        render_topology(xml, [], name="topo.xml")
    assert str(exc.value).startswith("topo.xml: ")


def test_a_nic_class_pci_left_with_only_a_comment_is_pruned_not_read_as_a_nic() -> None:
    """A hand-written file (a fuzz find from the p4d file) nests the p4d NIC 0000:90:1b.0 in a
    NIC-class <pci> 0000:c3:00.0 that also holds a comment. Removing the unusable NIC leaves
    the outer one with the comment only: parse_nccl_topo (and NCCL) drop comments, so it
    would read as a bare NIC the file never named. It is pruned like an empty one."""
    from linkguard.layout import parse_nccl_topo

    src = (
        '<system version="1"><cpu numaid="0" affinity="000000ff" arch="x86_64">'
        '<pci busid="0000:c3:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" link_width="8">'
        " <!-- GPU 5 -->"
        '<pci busid="0000:90:1b.0" class="0x020000" vendor="0x1d0f" device="0xefa0"'
        ' link_speed="8 GT/s" link_width="16"/> <!-- NIC 2 --></pci>'
        '<pci busid="0000:10:1c.0" class="0x030200" vendor="0x10de" device="0x20b0"/>'
        "</cpu></system>"
    )
    assert [n.bdf for n in parse_nccl_topo(src, source="in").nics] == ["0000:90:1b.0"]
    verdict = _down("efa0", "0000:90:1b.0")
    out = render_topology(src, [verdict], name="hand-written")
    assert out.removed == ("efa0/1",)
    assert out.nics == ()
    assert "0000:c3:00.0" not in out.xml and "0000:10:1c.0" in out.xml
    assert parse_nccl_topo(out.xml, source="rendered").nics == ()


def test_a_nic_class_pci_left_with_only_an_unknown_element_is_pruned_not_read_as_a_nic() -> None:
    """A fuzz find (the p5 file with the p4d file spliced into a NIC's <pci>): the NIC-class
    <pci> 0000:61:00.0 holds a <nic> and an element NCCL skips (here a nested <system>).
    Removing the unusable NIC left it with that element only, which parse_nccl_topo (as NCCL's
    xml.cc) ignores, so it read as a bare NIC without a dev beside NICs with one and the
    rendered file no longer parsed. It is pruned like an empty one."""
    from linkguard.layout import parse_nccl_topo

    src = (
        '<system version="1"><cpu numaid="0" affinity="000000ff" arch="x86_64">'
        '<pci busid="0000:60:00.0" class="0x030200"><gpu dev="0" rank="0"/></pci>'
        '<pci busid="0000:61:00.0" class="0x020000"><system version="1"><cpu numaid="1">'
        '<pci busid="0000:a0:1b.0" class="0x020000"/></cpu></system>'
        '<nic><net name="rdmap97s0" dev="0" port="1"/></nic></pci>'
        '<pci busid="0000:62:00.0" class="0x020000">'
        '<nic><net name="rdmap98s0" dev="1" port="1"/></nic></pci>'
        "</cpu></system>"
    )
    before = parse_nccl_topo(src, source="in").nics
    assert [(n.index, n.name) for n in before] == [(0, "rdmap97s0"), (1, "rdmap98s0")]
    verdict = _down("rdmap97s0", "0000:61:00.0")
    out = render_topology(src, [verdict], name="spliced")
    assert out.removed == ("rdmap97s0/1",)
    assert out.nics == ("rdmap98s0",)
    assert "0000:61:00.0" not in out.xml and "0000:62:00.0" in out.xml
    after = parse_nccl_topo(out.xml, source="rendered").nics
    assert [(n.index, n.name, n.bdf) for n in after] == [(1, "rdmap98s0", "0000:62:00.0")]
