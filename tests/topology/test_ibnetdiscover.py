"""ibnetdiscover / ibsim import: the real X5 dump, every ibsim example net, and bad input."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter

import pytest

from linkguard.topology.export import to_ibnetdiscover
from linkguard.topology.fabric import Fabric, FabricError
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.ibnetdiscover import (
    FabricImportError,
    import_ibnetdiscover,
    load_guid_map,
    parse_ibnetdiscover,
)
from tests.conftest import FIXTURES

REAL = FIXTURES
X5 = REAL / "ltaulell-HPC_toolset"
IBSIM = REAL / "linux-rdma-ibsim"
IP = ipaddress.IPv4Address


@pytest.fixture(scope="module")
def x5():
    return import_ibnetdiscover(X5 / "X5.topofile", guid_map=X5 / "X5.map")


def _kinds(f: Fabric) -> Counter[str]:
    return Counter(link.kind for link in f.links)


def _hostlist(expr: str) -> set[str]:
    """Expand a Slurm hostlist (``sl390lin[1-5,7],H-003048c749450000``)."""
    out: set[str] = set()
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", expr):
        if plain:
            out.add(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            out.update(f"{prefix}{i}" for i in range(int(lo), int(hi or lo) + 1))
    return out


# --------------------------------------------------------------------------------------------
# The real dump: PSMN X5 (ENS Lyon), 2020


def test_x5_counts_and_speeds(x5) -> None:
    f = x5.fabric
    assert f.name == "X5"
    assert len(f.switches) == 11
    assert len(f.hosts) == 89
    assert all(len(h.hcas) == 1 for h in f.hosts)  # 89 single-port ConnectX CAs
    assert _kinds(f) == {"host-leaf": 89, "leaf-spine": 64, "spine-spine": 6}
    speeds = Counter((link.kind, link.width, link.speed, link.rate_gbps) for link in f.links)
    assert speeds == {
        ("host-leaf", "4x", "QDR", 40.0): 66,
        ("host-leaf", "4x", "DDR", 20.0): 23,
        ("leaf-spine", "4x", "QDR", 40.0): 64,
        ("spine-spine", "4x", "QDR", 40.0): 6,
    }
    # 70 switch-switch cables over 24 switch pairs: parallel ISLs stay separate links.
    pairs = Counter(frozenset((link.a, link.b)) for link in f.links if link.kind != "host-leaf")
    assert len(pairs) == 24
    assert Counter(pairs.values()) == {3: 18, 6: 2, 1: 4}
    assert pairs[frozenset(("S-0008f10500108c5c", "S-0008f10500200b50"))] == 6
    ports = {
        (link.a_port, link.b_port)
        for link in f.links
        if {link.a, link.b} == {"S-0008f10500200b50", "S-0008f10500108c5c"}
    }
    assert ports == {(1, 15), (2, 14), (3, 13), (34, 7), (35, 8), (36, 26)}


def test_x5_roles_match_the_spine_list(x5) -> None:
    spines = {
        line.strip() for line in (X5 / "X5.spine").read_text().splitlines() if line[:2] == "S-"
    }
    f = x5.fabric
    assert {s.name for s in f.switches if s.role == "spine"} == spines
    assert len([s for s in f.switches if s.role == "leaf"]) == 6
    by_name = {s.name: s for s in f.switches}
    sw = by_name["S-0008f10500108c5c"]
    assert (sw.guid, sw.description) == ("0008f10500108c5c", "Voltaire 4036 # 4036-8C5C")
    assert by_name["S-0002c90200417670"].description == "Infiniscale-IV Mellanox Technologies"
    # Every leaf link reaches a spine; the two spine-spine triples hang off 4036-86A2.
    ss = {frozenset((link.a, link.b)) for link in f.links if link.kind == "spine-spine"}
    assert ss == {
        frozenset(("S-0008f105001086a2", "S-0008f10500108530")),
        frozenset(("S-0008f105001086a2", "S-0008f1050010851e")),
    }


def test_x5_role_note_counts_as_fabric_show(x5) -> None:
    from linkguard.topology.export import summarize

    s = summarize(x5.fabric)
    assert (s.leaves, s.spines, s.cores) == (6, 4, 1)
    [note] = [n for n in x5.notes if n.startswith("roles:")]
    assert note == (
        "roles: 6 leaves (switches with a CA cabled), 4 spines, 1 core (spines cabled to spines "
        "only), as `fabric show` counts them"
    )
    # one rail, every host on one leaf: nothing disagrees
    assert not any("rail" in w for w in x5.warnings)


def test_x5_hosts_per_switch_match_slurm_topology_conf(x5) -> None:
    f = x5.fabric
    on_leaf: dict[str, set[str]] = {}
    neighbours: dict[str, set[str]] = {}
    for link in f.links:
        if link.kind == "host-leaf":
            on_leaf.setdefault(link.b, set()).add(link.a.split(":")[0])
        else:
            neighbours.setdefault(link.a, set()).add(link.b)
            neighbours.setdefault(link.b, set()).add(link.a)
    checked = 0
    for line in (X5 / "X5.topology.conf").read_text().splitlines():
        m = re.match(r"SwitchName=(\S+) (Nodes|Switches)=(\S+)", line)
        if not m:
            continue
        name, what, expr = m.groups()
        if what == "Nodes":
            assert on_leaf[name] == _hostlist(expr), name
        else:  # Slurm lists the switches a spine connects to
            assert set(expr.split(",")) <= neighbours[name], name
        checked += 1
    assert checked == 11
    assert sum(len(v) for v in on_leaf.values()) == 89


def test_x5_names_guids_rails_and_addresses(x5) -> None:
    f = x5.fabric
    h = f.host("sl390lin1")
    assert [(c.hca, c.port, c.rail) for c in h.hcas] == [("hca0", 1, 0)]
    assert x5.guids["sl390lin1:hca0"] == "78e7d10300227744"
    assert x5.guids["sl390lin1:hca0/1"] == "78e7d10300227745"
    assert x5.guids["S-0008f10500200b50"] == "0008f10500200b50"
    cable = next(link for link in f.links if link.a == "sl390lin1:hca0/1")
    assert (cable.b, cable.b_port, cable.speed) == ("S-0002c90200417670", 34, "QDR")
    # Three CAs are missing from X5.map: they keep their node names (as in topology.conf).
    unnamed = sorted(h.host for h in f.hosts if h.host.startswith("H-"))
    assert unnamed == ["H-003048c749450000", "H-003048c74ae20000", "H-78e7d1030024535c"]
    assert "3 CAs are not in the GUID map" in " ".join(x5.warnings)
    assert f.rails == [0]
    assert all(s.rail == 0 for s in f.switches if s.role == "leaf")
    addrs = [h.hcas[0].address for h in f.hosts]
    assert addrs == [IP(f"10.100.0.{i}") for i in range(1, 90)]
    assert all(not h.endpoints for h in f.hosts)
    notes = " ".join(x5.notes)
    assert "rails inferred from the leaf each HCA hangs off" in notes
    assert "rail addresses assigned" in notes
    assert "86 from the GUID map" in notes


def test_x5_without_map_uses_node_names() -> None:
    r = import_ibnetdiscover(X5 / "X5.topofile")
    # "MT25408 ConnectX Mellanox Technologies" is the firmware default, not a host name.
    assert all(re.fullmatch(r"H-[0-9a-f]{16}", h.host) for h in r.fabric.hosts)
    assert len(r.fabric.hosts) == 89
    assert "89 from the CA node name" in " ".join(r.notes)


def test_guid_map_file() -> None:
    m = load_guid_map(X5 / "X5.map")
    assert len(m) == 86
    assert m["003048c74e4a0000"] == "x5570comp1"


# --------------------------------------------------------------------------------------------
# ibsim example nets (plain names, Hca records, no widths)

IBSIM_EXPECT = {
    # file: (switches as (name, role), hosts -> [(hca, port, rail)], switch-switch kinds)
    "net": (
        [("Switch1", "leaf"), ("Switch2", "spine")],
        {"Hca1": [("hca0", 1, 0)], "Hca2": [("hca0", 2, 0)]},
        {"leaf-spine": 2},
    ),
    "net.1": ([("Switch1", "leaf")], {"Hca1": [("hca0", 1, 0)], "Hca2": [("hca0", 1, 0)]}, {}),
    "net.2sw2path": (
        [("Switch1", "leaf"), ("Switch2", "leaf")],
        {"Hca1": [("hca0", 1, 0)], "Hca2": [("hca0", 1, 0)]},
        {"leaf-leaf": 2},
    ),
    "net.2sw2path4hca": (
        [("Switch1", "leaf"), ("Switch2", "leaf")],
        {f"Hca{i}": [("hca0", 1, 0)] for i in (1, 3, 2, 4)},
        {"leaf-leaf": 2},
    ),
    "net.2sw2path4hca2port": (
        [("Switch1", "leaf"), ("Switch2", "leaf")],
        {"Hca1": [("hca0", 1, 0), ("hca0", 2, 1)], "Hca2": [("hca0", 1, 0), ("hca0", 2, 1)]},
        {"leaf-leaf": 2},
    ),
}


@pytest.mark.parametrize("net", IBSIM_EXPECT)
def test_ibsim_nets(net: str) -> None:
    switches, hosts, isl = IBSIM_EXPECT[net]
    r = import_ibnetdiscover(IBSIM / net)
    f = r.fabric
    assert [(s.name, s.role) for s in f.switches] == switches
    assert {h.host: [(c.hca, c.port, c.rail) for c in h.hcas] for h in f.hosts} == hosts
    n_ports = sum(len(v) for v in hosts.values())
    assert _kinds(f) == {"host-leaf": n_ports, **isl}
    assert all(link.rate_gbps is None and link.width is None for link in f.links)
    assert "carry no width/speed" in " ".join(r.notes)
    assert r.guids == {}  # plain names, no guid stanzas


def test_ibsim_parallel_paths_and_dual_port_hcas() -> None:
    r = import_ibnetdiscover(IBSIM / "net.2sw2path4hca2port")
    f = r.fabric
    isl = sorted((link.a, link.a_port, link.b, link.b_port) for link in f.links[4:])
    assert isl == [("Switch1", 3, "Switch2", 3), ("Switch1", 5, "Switch2", 5)]
    h1 = f.host("Hca1")
    assert [str(c.address) for c in h1.hcas] == ["10.100.0.1", "10.100.1.1"]
    cables = {link.a: (link.b, link.b_port) for link in f.links if link.kind == "host-leaf"}
    assert cables["Hca1:hca0/2"] == ("Switch1", 2)
    assert cables["Hca2:hca0/1"] == ("Switch2", 1)
    # Both ports of a dual-port HCA on one leaf: the leaf carries two inferred rails.
    assert [s.rail for s in f.switches] == [None, None]
    assert r.warnings == [
        "2 HCA ports cannot have the inferred rail of their leaf: another port of their host "
        "has it (a cabling fault, or several ports of a host on one leaf; such a leaf gets no "
        "rail): Hca1:hca0/2 on Switch1 (the leaf's rail 0; given rail 1); Hca2:hca0/2 on "
        "Switch2 (the leaf's rail 0; given rail 1)"
    ]
    topo = parse_ibnetdiscover((IBSIM / "net").read_text())
    assert [(n.kind, n.name) for n in topo.nodes] == [
        ("switch", "Switch1"),
        ("ca", "Hca1"),
        ("ca", "Hca2"),
        ("switch", "Switch2"),
    ]
    assert all(link.both_ends for link in topo.links)
    assert len(topo.links) == 4


# --------------------------------------------------------------------------------------------
# Synthetic dumps: a 2-rail fabric as rdma-ndd describes hosts, rates, ibsim extensions

RAILS = """\
# two hosts, two rails, one spine
switchguid=0x1000(1000)
Switch\t8 "S-0000000000001000"\t\t# "leaf A" enhanced port 0 lid 1 lmc 0
[1]\t"H-000000000000a000"[1](a001) \t\t# "gpu001 mlx5_0" lid 10 4xNDR
[2]\t"H-000000000000b000"[1](b001) \t\t# "gpu002 mlx5_0" lid 12 4xNDR
[7]\t"S-0000000000003000"[1]\t\t# "spine" lid 3 4xNDR
[8]\t"S-0000000000003000"[2]\t\t# "spine" lid 3 4xNDR

Switch\t8 "S-0000000000002000"\t\t# "leaf B" base port 0 lid 2 lmc 0
[1]\t"H-000000000000a100"[1](a101) \t\t# "gpu001 mlx5_1" lid 11 4xHDR
[2]\t"H-000000000000b100"[1](b101) \t\t# "gpu002 mlx5_1" lid 13 2xNDR
[7]\t"S-0000000000003000"[3]\t\t# "spine" lid 3 4xNDR

Switch\t8 "S-0000000000003000"\t\t# "spine" enhanced port 0 lid 3 lmc 0
[1]\t"S-0000000000001000"[7]\t\t# "leaf A" lid 1 4xNDR
[2]\t"S-0000000000001000"[8]\t\t# "leaf A" lid 1 4xNDR
[3]\t"S-0000000000002000"[7]\t\t# "leaf B" lid 2 4xNDR

caguid=0xa000
Ca\t1 "H-000000000000a000"\t\t# "gpu001 mlx5_0"
[1](a001) \t"S-0000000000001000"[1]\t\t# lid 10 lmc 0 "leaf A" lid 1 4xNDR

Ca\t1 "H-000000000000a100"\t\t# "gpu001 mlx5_1"
[1](a101) \t"S-0000000000002000"[1]\t\t# lid 11 lmc 0 "leaf B" lid 2 4xHDR

Ca\t1 "H-000000000000b000"\t\t# "gpu002 mlx5_0"
[1](b001) \t"S-0000000000001000"[2]\t\t# lid 12 lmc 0 "leaf A" lid 1 4xNDR

Ca\t1 "H-000000000000b100"\t\t# "gpu002 mlx5_1"
[1](b101) \t"S-0000000000002000"[2]\t\t# lid 13 lmc 0 "leaf B" lid 2 2xNDR
"""


def test_hosts_with_several_hcas_from_descriptions() -> None:
    r = import_ibnetdiscover(RAILS, name="rails")
    f = r.fabric
    assert f.host_names == ["gpu001", "gpu002"]
    g1 = f.host("gpu001")
    assert [(c.hca, c.rail, str(c.address)) for c in g1.hcas] == [
        ("mlx5_0", 0, "10.100.0.1"),
        ("mlx5_1", 1, "10.100.1.1"),
    ]
    assert [(s.name, s.role, s.rail) for s in f.switches] == [
        ("S-0000000000001000", "leaf", 0),
        ("S-0000000000003000", "spine", None),
        ("S-0000000000002000", "leaf", 1),
    ]
    rates = {link.a: (link.width, link.speed, link.rate_gbps) for link in f.links}
    assert rates["gpu001:mlx5_0/1"] == ("4x", "NDR", 400.0)
    assert rates["gpu001:mlx5_1/1"] == ("4x", "HDR", 200.0)
    assert rates["gpu002:mlx5_1/1"] == ("2x", "NDR", 200.0)
    ls = [(link.a, link.a_port, link.b, link.b_port, link.rail) for link in f.links[4:]]
    assert ls == [
        ("S-0000000000001000", 7, "S-0000000000003000", 1, 0),
        ("S-0000000000001000", 8, "S-0000000000003000", 2, 0),
        ("S-0000000000002000", 7, "S-0000000000003000", 3, 1),
    ]
    assert r.guids["gpu002:mlx5_1"] == "000000000000b100"
    assert r.guids["gpu002:mlx5_1/1"] == "000000000000b101"
    assert "host names: 2 from descriptions" in r.notes  # 2 hosts (of 4 CAs)
    assert r.warnings == []


def test_host_of_and_guid_map_override(tmp_path) -> None:
    r = import_ibnetdiscover(RAILS, host_of=lambda guid, desc: f"n{guid[-4:-3]}")
    assert r.fabric.host_names == ["na", "nb"]
    m = tmp_path / "map"
    m.write_text('# comment\nH-000000000000a000 alpha\n0xa100 "alpha"\n')
    r = import_ibnetdiscover(RAILS, guid_map=m)
    assert r.fabric.host_names == ["alpha", "gpu002"]
    assert [c.hca for c in r.fabric.host("alpha").hcas] == ["mlx5_0", "mlx5_1"]
    assert "2 CAs are not in the GUID map" in " ".join(r.warnings)
    assert "host names: 1 from descriptions, 1 from the GUID map" in r.notes


def test_guid_map_in_node_name_map_style(tmp_path) -> None:
    """A node-name-map names each CA by its description, "<host> <device>": the host is the
    first word (not a host "gpu001-mlx5_1"); both map styles mix in one file."""
    m = tmp_path / "node-name-map"
    m.write_text(
        "H-000000000000a000 alpha\n"
        '0x000000000000a100 "alpha mlx5_1"\n'
        '0xb000 "beta mlx5_0"\n'
        "0x000000000000b100  beta   mlx5_1\n"
    )
    assert load_guid_map(m) == {
        "000000000000a000": "alpha",
        "000000000000a100": "alpha",
        "000000000000b000": "beta",
        "000000000000b100": "beta",
    }
    r = import_ibnetdiscover(RAILS, guid_map=m)
    assert r.fabric.host_names == ["alpha", "beta"]
    assert [c.hca for c in r.fabric.host("beta").hcas] == ["mlx5_0", "mlx5_1"]
    assert "host names: 2 from the GUID map" in r.notes
    assert r.warnings == []


def test_switch_loopback_cable_is_dropped_with_a_warning() -> None:
    spine = '[3]\t"S-0000000000002000"[7]\t\t# "leaf B" lid 2 4xNDR\n'
    loop = (
        '[5]\t"S-0000000000003000"[6]\t\t# "spine" lid 3 4xNDR\n'
        '[6]\t"S-0000000000003000"[5]\t\t# "spine" lid 3 4xNDR\n'
    )
    text = RAILS.replace(spine, spine + loop)
    assert text != RAILS
    r = import_ibnetdiscover(text)
    assert r.warnings == ["1 cables between two ports of one switch dropped (loopback): line 18"]
    assert len(r.fabric.links) == len(import_ibnetdiscover(RAILS).fabric.links) == 7
    assert all(link.a != link.b for link in r.fabric.links)


@pytest.mark.parametrize(
    ("token", "expect"),
    [
        ("4xQDR", ("4x", "QDR", 40.0)),
        ("4xFDR10", ("4x", "FDR10", 40.0)),
        ("4xFDR", ("4x", "FDR", 56.0)),
        ("12xEDR", ("12x", "EDR", 300.0)),
        ("4xHDR", ("4x", "HDR", 200.0)),
        ("1xSDR", ("1x", "SDR", 2.5)),
        ("4x???", ("4x", None, None)),
        ("4xQDR s=4 w=2 v=3", ("4x", "QDR", 40.0)),  # ibnetdiscover --full
    ],
)
def test_width_speed_tokens(token: str, expect: tuple) -> None:
    text = RAILS.replace("lid 10 4xNDR", f"lid 10 {token}").replace(
        '"leaf A" lid 1 4xNDR\n\nCa\t1 "H-000000000000a100"',
        f'"leaf A" lid 1 {token}\n\nCa\t1 "H-000000000000a100"',
    )
    topo = parse_ibnetdiscover(text)
    link = next(link for link in topo.links if topo.nodes[link.b].name == "H-000000000000a000")
    assert (link.width, link.speed, link.rate_gbps) == expect
    assert bool(topo.warnings) == (expect[1] is None)


def test_ibsim_masks_extensions_and_ignored_lines() -> None:
    text = (
        'include "other.net"\ndo seed 3\nwidth=2\n\n'
        'Switch 4 "sw"\n[1] "node1"[1] w=2 s=4\n[2] "node2" w=8\n\n'
        'Hca 1 "node1"\n[1] "sw"[1] w=2 s=4\n\nHca 1 "node2"\n[1] "sw"[2]\n'
    )
    r = import_ibnetdiscover(text)
    rates = {link.a: (link.width, link.speed, link.rate_gbps) for link in r.fabric.links}
    assert rates == {"node1:hca0/1": ("4x", "QDR", 40.0), "node2:hca0/1": ("12x", None, None)}
    notes = " ".join(r.notes)
    assert "'include' extension (included file not read)" in notes
    assert "'do' extension" in notes
    assert "ibsim setting 'width=2'" in notes


def test_grouping_ext_ports_routers_and_odd_bytes(tmp_path) -> None:
    text = (
        "\nChassis 1 (guid 0x1)\n\n# Spine Nodes\nNon-Chassis Nodes\n\n"
        "vendid=0x2c9\nsysimgguid=0x1\t\t# Chassis 1 (sw)\nswitchguid=0x1(1)\t# ISR9024 Line 1\n"
        'Switch\t24 "S-0000000000000001"\t\t# "line \xe9" base port 0 lid 1 lmc 0\n'
        '[1][ext 5]\t"H-0000000000000002"[1](3) \t\t# "h1 mlx4_0" lid 2 4xDDR\n'
        '[2]\t"R-0000000000000004"[1](5) \t\t# "router" lid 4 4xDDR\n\n'
        'Ca\t2 "H-0000000000000002"\t\t# "h1 mlx4_0"\n'
        '[1](3) \t"S-0000000000000001"[1][ext 5]\t\t# lid 2 lmc 0 "line" lid 1 4xDDR\n\n'
        'Rt\t1 "R-0000000000000004"\t\t# "router"\n'
        '[1](5) \t"S-0000000000000001"[2]\t\t# lid 4 lmc 0 "line" lid 1 4xDDR\n'
    )
    path = tmp_path / "g.topo"
    path.write_bytes(text.encode("latin-1"))
    r = import_ibnetdiscover(path)
    f = r.fabric
    assert [(s.name, s.role) for s in f.switches] == [
        ("S-0000000000000001", "leaf"),
        ("R-0000000000000004", "spine"),
    ]
    assert f.host("h1").hcas[0].hca == "mlx4_0"
    assert [(x.kind, x.rate_gbps) for x in f.links] == [("host-leaf", 20.0), ("leaf-spine", 20.0)]
    assert "routers treated as switches" in " ".join(r.notes)
    assert "grouping" in " ".join(r.notes)
    assert "not UTF-8" in " ".join(r.warnings)
    assert f.switches[0].description == "line \ufffd"


# --------------------------------------------------------------------------------------------
# Bad input


def test_malformed_link_line_names_file_and_line(tmp_path) -> None:
    lines = (X5 / "X5.topofile").read_text().splitlines(keepends=True)
    assert lines[12].startswith("[3]\t")
    lines[12] = '[3]\tS-0008f10500108c5c"[13]\t\t# "x" lid 16 4xQDR\n'
    bad = tmp_path / "bad.topofile"
    bad.write_text("".join(lines))
    with pytest.raises(FabricImportError, match=r"bad\.topofile:13: malformed port line") as e:
        import_ibnetdiscover(bad)
    assert (e.value.line, e.value.source) == (13, str(bad))
    assert isinstance(e.value, FabricError) and isinstance(e.value, ValueError)


BAD = {
    "unknown-node": ('Switch 2 "sw"\n[1] "ghost"[1]\n', r"<text>:2: link to 'ghost', which no"),
    "port-range": ('Switch 2 "sw"\n[3] "h"[1]\n\nCa 1 "h"\n[1] "sw"[3]\n', r":2: port 3 of 'sw'"),
    "remote-port-range": ('Switch 2 "sw"\n[1] "h"[2]\n\nCa 1 "h"\n', r":2: remote port 2 of 'h'"),
    "cabled-twice": (
        'Switch 2 "sw"\n[1] "h"[1]\n[2] "h"[1]\n\nCa 1 "h"\n[1] "sw"[1]\n',
        r"port 1 of 'h' is cabled twice",
    ),
    "port-outside-record": ('Switch 2 "sw"\n\n[1] "h"[1]\n', r":3: port line outside"),
    "garbage": ('Switch 2 "sw"\nhello world\n', r":2: unrecognized line 'hello world'"),
    "bad-stanza": ("caguid=zz\n", r":1: unrecognized line"),
    "bad-option": ('Switch 2 "sw"\n[1] "h"[1] x=3\n', r":2: unexpected 'x=3'"),
    "empty": ("", r"no Switch or Ca record"),
    "comments-only": ("# nothing\n\n", r"no Switch or Ca record"),
    "no-host": ('Switch 2 "a"\n[1] "b"[1]\n\nSwitch 2 "b"\n[1] "a"[1]\n', r"no CA cabled"),
}


@pytest.mark.parametrize(("text", "expect"), BAD.values(), ids=BAD.keys())
def test_bad_input(text: str, expect: str) -> None:
    with pytest.raises(FabricImportError, match=expect):
        import_ibnetdiscover(text)


def test_empty_and_missing_files(tmp_path) -> None:
    empty = tmp_path / "empty.topo"
    empty.write_text("")
    with pytest.raises(FabricImportError, match=r"empty\.topo: no Switch or Ca record"):
        import_ibnetdiscover(empty)
    with pytest.raises(FabricImportError, match="cannot read topology file"):
        import_ibnetdiscover(tmp_path / "nope")
    bad_map = tmp_path / "map"
    bad_map.write_text("H-003048c74e4a0000 a\nnot a map line\n")
    with pytest.raises(FabricImportError, match=r"map:2: not '<guid> <name>'"):
        import_ibnetdiscover(X5 / "X5.topofile", guid_map=bad_map)


def test_truncated_dump_keeps_what_was_read() -> None:
    text = (X5 / "X5.topofile").read_text()
    cut = text.index('Ca\t1 "H-78e7d10300229794"') + 20  # mid-line, inside the CA records
    r = import_ibnetdiscover(text[:cut])
    warnings = " ".join(r.warnings)
    assert "ends in the middle of a line" in warnings
    assert "only known from links to them" in warnings
    # All switch records were read; CAs whose records were cut are known from the switches.
    assert len(r.fabric.switches) == 11
    assert len(r.fabric.hosts) == 89
    assert _kinds(r.fabric) == {"host-leaf": 89, "leaf-spine": 64, "spine-spine": 6}
    # Ends mid-stanza: the stanza lines without their header.
    stanza = text.index("vendid=0x2c9\ndevid=0x6732")
    r = import_ibnetdiscover(text[: stanza + 25])
    assert "without its Switch/Ca header" in " ".join(r.warnings)
    assert len(r.fabric.hosts) == 89
    # A truncated ibsim file: links to plain names never declared are dropped, not fatal.
    r = import_ibnetdiscover('Switch 4 "sw"\n[1] "h1"[1]\n[2] "h2"[1]\n\nHca 1 "h1"\n[1] "sw"[')
    assert r.fabric.host_names == ["h1"]
    assert "links to undeclared nodes dropped" in " ".join(r.warnings)


def test_description_with_quotes_and_hash() -> None:
    desc = 'node7 mlx5_2 "rack #3" lid 9'
    text = (
        f'Switch 4 "S-0000000000000001"\t# "sw # one" enhanced port 0 lid 1 lmc 0\n'
        f'[1]\t"H-0000000000000007"[1](8)\t# "{desc}" lid 5 4xEDR\n\n'
        f'Ca 1 "H-0000000000000007"\t# "{desc}"\n'
        f'[1](8)\t"S-0000000000000001"[1]\t# lid 5 lmc 0 "sw # one" lid 1 4xEDR\n'
    )
    r = import_ibnetdiscover(text)
    assert r.fabric.host_names == ["node7"]
    assert r.fabric.host("node7").hcas[0].hca == "mlx5_2"
    link = r.fabric.links[0]
    assert (link.width, link.speed, link.rate_gbps) == ("4x", "EDR", 100.0)
    assert r.fabric.switches[0].description == "sw # one"
    topo = parse_ibnetdiscover(text)
    assert topo.nodes[1].description == desc


def test_duplicate_guid_is_a_warning() -> None:
    # Two CAs flashed with one GUID: both records kept, links go to the one that points back.
    text = (
        'Switch 4 "S-0000000000000001"\n'
        '[1]\t"H-00000000000000aa"[1]\t# "n1 mlx5_0" lid 5 4xHDR\n'
        '[2]\t"H-00000000000000aa"[1]\t# "n2 mlx5_0" lid 6 4xHDR\n\n'
        'Ca 1 "H-00000000000000aa"\t# "n1 mlx5_0"\n[1]\t"S-0000000000000001"[1]\n\n'
        'Ca 1 "H-00000000000000aa"\t# "n2 mlx5_0"\n[1]\t"S-0000000000000001"[2]\n'
    )
    r = import_ibnetdiscover(text)
    assert r.fabric.host_names == ["n1", "n2"]
    assert [link.b_port for link in r.fabric.links] == [1, 2]
    assert "duplicate node 'H-00000000000000aa'" in " ".join(r.warnings)
    assert r.guids["n1:mlx5_0"] == r.guids["n2:mlx5_0"] == "00000000000000aa"


def test_generated_rail_optimized_fabric_round_trips() -> None:
    gen = generate_rail_optimized(hosts=8, rails=4, hosts_per_su=4, spines_per_su=2)
    text, sw_of = to_ibnetdiscover(gen)
    r = import_ibnetdiscover(text)
    f = r.fabric
    assert f.host_names == gen.host_names
    for h in gen.hosts:
        want = [(c.hca, c.port, c.rail, c.address) for c in h.hcas]
        assert [(c.hca, c.port, c.rail, c.address) for c in f.host(h.host).hcas] == want
    want = Counter((x.a, x.b, x.kind, x.rail, x.rate_gbps) for x in gen.links)
    got = Counter(
        (sw_of.get(x.a, x.a), sw_of.get(x.b, x.b), x.kind, x.rail, x.rate_gbps) for x in f.links
    )
    assert got == want
    assert {sw_of[s.name]: (s.role, s.rail) for s in f.switches} == {
        s.name: (s.role, s.rail) for s in gen.switches
    }
    assert r.warnings == []


# --------------------------------------------------------------------------------------------
# Rails of a dump with cabling faults: only the HCAs that disagree are named

#: 2 SUs x 8 hosts x 4 rails (leaves su{0,1}-leaf{0..3} = switches 0..7, S-000000000000100<i>)
FAULTY = generate_rail_optimized(hosts=16, rails=4, hosts_per_su=8)


def _import_recabled(moves: dict[str, str | None]):
    """Import the dump of FAULTY with the host cables in ``moves`` moved to another leaf (or
    removed: None)."""
    links = [
        x if x.a not in moves else x.model_copy(update={"b": moves[x.a]})
        for x in FAULTY.links
        if moves.get(x.a, "") is not None
    ]
    text, sw_of = to_ibnetdiscover(FAULTY, links=links)
    r = import_ibnetdiscover(text)
    rails = {sw_of[s.name]: s.rail for s in r.fabric.switches if s.role == "leaf"}
    return r, rails


def _rails(r, host: str) -> dict[str, int]:
    return {c.hca: c.rail for c in r.fabric.host(host).hcas}


def test_a_cable_on_another_sus_leaf_shifts_no_rail() -> None:
    r, rails = _import_recabled({"gpu003:mlx5_0/1": "su1-leaf0"})
    assert r.warnings == []  # before: 4 leaves "carry HCAs of several inferred rails"
    assert rails == {f"su{s}-leaf{k}": k for s in range(2) for k in range(4)}
    assert _rails(r, "gpu003") == {f"mlx5_{k}": k for k in range(4)}


def test_a_missing_cable_shifts_no_rail() -> None:
    r, rails = _import_recabled({"gpu005:mlx5_0/1": None})
    assert r.warnings == []
    assert rails == {f"su{s}-leaf{k}": k for s in range(2) for k in range(4)}
    assert _rails(r, "gpu005") == {"mlx5_1": 1, "mlx5_2": 2, "mlx5_3": 3}
    # addresses in its rails' subnets (the host's index follows the dump's order)
    assert [c.address.packed[2] for c in r.fabric.host("gpu005").hcas] == [1, 2, 3]


def test_two_hcas_of_a_host_on_one_leaf_name_only_the_moved_one() -> None:
    r, rails = _import_recabled({"gpu003:mlx5_0/1": "su0-leaf1"})
    assert r.warnings == [
        "1 HCA ports cannot have the inferred rail of their leaf: another port of their host "
        "has it (a cabling fault, or several ports of a host on one leaf; such a leaf gets no "
        "rail): gpu003:mlx5_0/1 on S-0000000000001001 (the leaf's rail 1; given rail 0)"
    ]
    assert rails == {
        f"su{s}-leaf{k}": None if (s, k) == (0, 1) else k for s in range(2) for k in range(4)
    }
    assert _rails(r, "gpu003") == {f"mlx5_{k}": k for k in range(4)}


def test_export_writes_what_the_importer_reads_back() -> None:
    """Round trip through the shipped writer: same switches, HCAs, links and rates, for a
    generated fabric with a core tier and for the real X5 dump (its GUIDs, descriptions, ports,
    QDR and DDR links)."""
    from linkguard.topology.export import render

    cored = generate_rail_optimized(hosts=12, rails=2, hosts_per_su=4, spines_per_su=2, core=True)
    x5 = import_ibnetdiscover(X5 / "X5.topofile", guid_map=X5 / "X5.map").fabric
    for fabric in (cored, x5):
        text, sw_of = to_ibnetdiscover(fabric)
        assert render(fabric, "ibnetdiscover") == text
        back = import_ibnetdiscover(text, name=fabric.name).fabric
        assert {sw_of[s.name]: (s.role, s.rail) for s in back.switches} == {
            s.name: (s.role, s.rail) for s in fabric.switches
        }
        assert sum(len(h.hcas) for h in back.hosts) == sum(len(h.hcas) for h in fabric.hosts)
        assert _kinds(back) == _kinds(fabric)
        rates = Counter((x.kind, x.rate_gbps) for x in back.links)
        assert rates == Counter((x.kind, x.rate_gbps) for x in fabric.links)
    # the X5 import again: same GUIDs, descriptions, host names and port numbers
    assert back.host_names == x5.host_names
    assert sorted(back.switches, key=lambda s: s.name) == sorted(x5.switches, key=lambda s: s.name)
    assert back.hosts == x5.hosts

    # every cable between the same ports, same width and speed (switch-switch ones may name
    # their ends the other way round: the end listed first comes first)
    def ends(f: Fabric) -> Counter:
        return Counter(
            (frozenset(((x.a, x.a_port), (x.b, x.b_port))), x.kind, x.width, x.speed)
            for x in f.links
        )

    assert ends(back) == ends(x5)


def test_export_widths_speeds_and_refusals() -> None:
    from linkguard.topology.fabric import Link

    f = generate_rail_optimized(hosts=2, rails=1, spines_per_su=0)
    text, _ = to_ibnetdiscover(f)
    assert text.count("4xNDR") == 4  # 2 cables, each listed from both ends
    [ca_line] = [x for x in text.splitlines() if x.startswith("[1](a0001)")]
    assert ca_line == (
        '[1](a0001) \t"S-0000000000001000"[1]\t\t# lid 2 lmc 0 "su0-leaf0" lid 1 4xNDR'
    )
    odd = [
        f.links[0].model_copy(update={"rate_gbps": 100.0}),  # 4xEDR
        f.links[1].model_copy(update={"rate_gbps": None}),  # unknown: ?????
    ]
    r = import_ibnetdiscover(to_ibnetdiscover(f, links=odd)[0])
    assert [(x.width, x.speed, x.rate_gbps) for x in r.fabric.links] == [
        ("4x", "EDR", 100.0),
        (None, None, None),
    ]
    twice = [*f.links, f.links[0].model_copy(update={"b_port": 1})]
    with pytest.raises(ValueError, match="gpu000:mlx5_0/1 is cabled twice"):
        to_ibnetdiscover(f, links=twice)
    two = generate_rail_optimized(hosts=2, rails=2, spines_per_su=0)
    many = [Link(a="su0-leaf0", b="su0-leaf1", kind="leaf-leaf")] * 256
    with pytest.raises(ValueError, match=r"su0-leaf0 needs 256 ports \(InfiniBand allows 255\)"):
        to_ibnetdiscover(two, links=many)
