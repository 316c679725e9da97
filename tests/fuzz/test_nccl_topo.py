"""NCCL topology files (``NCCL_TOPO_FILE`` XML) through the layout reader and the renderer,
damaged (the real aws-ofi-nccl p4d and p5 files with bytes flipped, lines dropped, duplicated
or swapped, cut short) and built from random elements: only LayoutError (parse) and
TopologyFileError (render) may escape, a layout's affinity order holds, and what is rendered
renders and parses again (:func:`fuzz.targets.nccl_topo`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.strategies import mutated
from fuzz.targets import nccl_topo, seeds
from linkguard.layout import LayoutError, parse_nccl_topo
from linkguard.nccl import TopologyFileError, render_topology
from tests.fuzz.profiles import FUZZ


@pytest.fixture(scope="module")
def files(real_fixtures) -> list[bytes]:
    """p4d-24xl-topo.xml (bare GPU/NIC ``<pci>``) and p5.48xl-topo.xml (``<gpu>``, ``<nic>``
    with four ``<net>`` per GPU), as the fixtures have them."""
    out = seeds("nccl_topo")
    assert [len(b) > 3000 and b.count(b"<pci ") >= 12 for b in out] == [True, True]
    return out


def test_the_real_files_pass(files: list[bytes]) -> None:
    for data in files:
        nccl_topo(data)


def test_mutated_real_files(files: list[bytes]) -> None:
    @FUZZ
    @given(st.sampled_from(files).flatmap(lambda d: mutated(d, max_ops=6)))
    def check(data: bytes) -> None:
        nccl_topo(data)

    check()


def test_real_files_cut_at_every_line(files: list[bytes]) -> None:
    for data in files:
        lines = data.splitlines(keepends=True)
        for n in range(1, len(lines) + 1):
            nccl_topo(b"".join(lines[:n]))


_ATTRS = st.dictionaries(
    st.sampled_from(["busid", "class", "vendor", "numaid", "dev", "name", "port"]),
    st.one_of(
        st.sampled_from(
            ["0000:10:1c.0", "ffff:ff:01.0", "0x030200", "0x020000", "0x060400", "0x10de"]
        ),
        st.sampled_from(["0", "1", "-1", "7", "1024", "256", "x", "", " 3 ", "0x1f"]),
        st.text(max_size=8),
    ),
    max_size=3,
)
_TAGS = st.sampled_from(["cpu", "pci", "gpu", "nic", "net", "nvlink", "system"])


def _element(depth: int) -> st.SearchStrategy[str]:
    kids = st.lists(_element(depth - 1), max_size=3) if depth > 0 else st.just([])

    def build(tag: str, attrs: dict[str, str], children: list[str]) -> str:
        text = " ".join(
            f'{k}="{v.replace("&", "&amp;").replace(chr(34), "&quot;").replace("<", "&lt;")}"'
            for k, v in attrs.items()
        )
        return f"<{tag} {text}>{''.join(children)}</{tag}>"

    return st.builds(build, _TAGS, _ATTRS, kids)


@FUZZ
@given(st.lists(_element(4), max_size=3).map(lambda xs: f"<system>{''.join(xs)}</system>"))
def test_random_element_trees(doc: str) -> None:
    nccl_topo(doc.encode())


@pytest.mark.parametrize(
    "doc",
    [
        b'<!DOCTYPE s [<!ENTITY a "aaaa">]><system>&a;</system>',
        b'<system><cpu numaid="0">' + b"<pci>" * 40 + b"</pci>" * 40 + b"</cpu></system>",
        b"\xff\xfe<\x00s\x00",
        b"",
        b"<topology/>",
    ],
    ids=["entities", "deep", "utf16-junk", "empty", "other-root"],
)
def test_hostile_documents_are_refused(doc: bytes) -> None:
    """Refused by both readers with their documented error (no entity expanded, no
    RecursionError, no UnicodeDecodeError)."""
    with pytest.raises(LayoutError, match=r"^fuzz: "):
        parse_nccl_topo(doc, source="fuzz")
    with pytest.raises(TopologyFileError, match=r"^fuzz: "):
        render_topology(doc, [], name="fuzz")
    nccl_topo(doc)


def test_a_number_of_5000_digits_is_a_layout_error() -> None:
    """int() refuses more than 4,300 digits with a bare ValueError: the reader names it."""
    doc = b'<system><cpu numaid="' + b"1" * 5000 + b'"><pci busid="0000:01:00.0"/></cpu></system>'
    with pytest.raises(LayoutError, match=r"^fuzz: <cpu> has numaid='1111"):
        parse_nccl_topo(doc, source="fuzz")
    nccl_topo(doc)


def test_regression_a_gpu_beside_a_nic_in_one_pci_is_kept() -> None:
    """A <pci> holding a <nic> and a nested GPU <pci> (a damaged p5 file: one start tag lost)
    lost the GPU; once the renderer removed the NIC, the GPU was back: layouts before and
    after rendering differed."""
    doc = (
        '<system><cpu numaid="0"><pci busid="0000:05:00.0" class="0x060400">'
        '<pci busid="0000:b0:00.0" class="0x030200"><gpu dev="0"/></pci>'
        '<nic><net name="rdmap182s0" dev="0" port="1"/></nic>'
        "</pci></cpu></system>"
    )
    layout = parse_nccl_topo(doc)
    assert [(g.bdf, g.switch) for g in layout.gpus] == [("0000:b0:00.0", "0000:05:00.0")]
    assert [(n.name, n.bdf, n.switch) for n in layout.nics] == [
        ("rdmap182s0", "0000:05:00.0", None)
    ]
    nccl_topo(doc.encode())


def test_regression_a_pci_emptied_by_the_renderer_is_removed() -> None:
    """A NIC-class <pci> whose only content was another NIC's <pci> (a damaged p5 file: an end
    tag moved) was left empty by the renderer, and an empty NIC-class <pci> reads as a bare
    NIC without dev: the rendered file no longer parsed ("some NICs have a dev attribute and
    some do not")."""
    doc = (
        '<system><cpu numaid="0"><pci busid="0000:01:00.0" class="0x060400">'
        '<pci busid="0000:4f:00.0" class="0x030200"><gpu dev="0"/></pci>'
        '<pci busid="0000:b1:00.0" class="0x020000">'
        '<pci busid="0000:94:00.0" class="0x020000"><nic><net name="a" dev="0"/></nic></pci>'
        "</pci>"
        '<pci busid="0000:95:00.0" class="0x020000"><nic><net name="b" dev="1"/></nic></pci>'
        "</pci></cpu></system>"
    )
    down = _verdicts(("a", False), ("b", True))
    out = render_topology(doc, down, name="t")
    assert out.removed == ("a/1",) and out.nics == ("b",)
    assert "0000:b1:00.0" not in out.xml and "0000:94:00.0" not in out.xml
    assert [n.name for n in parse_nccl_topo(out.xml).nics] == ["b"]
    nccl_topo(doc.encode())


def _verdicts(*ports: tuple[str, bool]) -> list:
    from fuzz.targets import _verdict

    return [_verdict(name, 1, None, usable) for name, usable in ports]
