"""``fabric discover``: the real H100 tree (gpud) as the hosts' reports, joined with the real
ibnetdiscover dump (X5) and the ibsim net files, and with LLDP captured from lldpd; the rules
that leave ports out, each with a minimal case."""

from __future__ import annotations

import ipaddress
import shutil
from collections import Counter
from pathlib import Path

import pytest

from linkguard.config import ServiceSettings
from linkguard.drivers.hostfacts import read_host_facts
from linkguard.drivers.lldp import read_lldp_file
from linkguard.models import HCAInfo, HostInventory, LinkLayer
from linkguard.models.discovery import HostDiscovery, NetdevFacts, RdmaPortFacts
from linkguard.topology.discover import discover_fabric
from linkguard.topology.fabric import dump_fabric, load_fabric
from linkguard.topology.ibnetdiscover import load_guid_map, parse_ibnetdiscover
from linkguard.topology.serviceio import fabric_from_settings
from linkguard.topology.solver import solve
from linkguard.topology.switchgraph import from_ibnetdiscover, from_lldp
from tests.support import H100, H100_IB_HCAS

LLDP = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"


def _colons(guid: str) -> str:
    return ":".join(guid[i : i + 4] for i in range(0, 16, 4))


@pytest.fixture
def h100(tmp_path: Path, fixtures_real: Path) -> Path:
    """A copy of the real H100 tree, changed minimally: each IB HCA gets the IPoIB netdev a
    real host has under ``device/net`` (gpud's copy has no ``device`` link)."""
    tree = tmp_path / "infiniband"
    shutil.copytree(fixtures_real / H100, tree)
    for i, hca in enumerate(H100_IB_HCAS):
        (tree / hca / "device" / "net" / f"ibp{i}s0").mkdir(parents=True)
    return tree


def _with_guids(tree: Path, guids: dict[str, tuple[str, str]]) -> None:
    """Write ``node_guid`` and ``ports/1/gids/0`` (the port GUID in its low 64 bits) of the
    HCAs named in ``guids`` ({hca: (node GUID, port GUID)}), as a real host has them."""
    for hca, (node, port) in guids.items():
        (tree / hca / "node_guid").write_text(_colons(node) + "\n")
        gids = tree / hca / "ports" / "1" / "gids"
        gids.mkdir(exist_ok=True)
        (gids / "0").write_text("fe80:0000:0000:0000:" + _colons(port) + "\n")


def _report(host: str, tree: Path) -> HostDiscovery:
    facts = read_host_facts(tree, tree.parent / "no-class-net")
    return HostDiscovery(host=host, ports=facts.ports, netdevs=facts.netdevs)


def _served(tmp_path: Path, result) -> None:
    """The fabric loads back from its file and the service's own loader accepts it; the
    solver gives every host a plan."""
    path = tmp_path / "discovered.yaml"
    path.write_text(dump_fabric(result.fabric, "yaml"))
    fabric = fabric_from_settings(ServiceSettings(fabric=path))
    assert fabric == load_fabric(path)
    plans = solve(fabric, {}, epoch=1, now=0.0)
    assert set(plans) == set(fabric.host_names)


def test_the_h100_tree_joined_with_the_real_x5_dump(
    tmp_path: Path, h100: Path, fixtures_real: Path
) -> None:
    """Each X5 compute node reports the H100 tree, mlx5_0 carrying its CA's GUIDs (the dump's
    CAs have one port each): mlx5_0 goes on the switch the dump cables it to, the other seven
    IB HCAs are listed as not in the switch graph, the bond as an in-band NIC."""
    x5 = fixtures_real / "ltaulell-HPC_toolset"
    topo = parse_ibnetdiscover((x5 / "X5.topofile").read_text(), source="X5.topofile")
    gmap = load_guid_map(x5 / "X5.map")
    reports, leaf_of = [], {}
    for n in topo.nodes:
        if n.kind != "ca" or n.guid not in gmap:
            continue
        _with_guids(h100, {"mlx5_0": (n.guid, topo.port_guids[(n.index, 1)])})
        reports.append(_report(gmap[n.guid], h100))
        cable = next(lk for lk in topo.links if n.index in (lk.a, lk.b))
        leaf_of[gmap[n.guid]] = topo.nodes[cable.b if cable.a == n.index else cable.a]
    result = discover_fabric(
        reports,
        from_ibnetdiscover(topo, gmap),
        name="x5",
        rail_prefix="10.100.0.0/16",
        endpoint_prefix="10.200.0.0/16",
    )
    f = result.fabric
    assert f is not None and f.name == "x5"
    assert len(f.hosts) == len(reports) == 86
    assert all([c.hca for c in h.hcas] == ["mlx5_0"] and h.hcas[0].rail == 0 for h in f.hosts)
    assert {h.hcas[0].netdev for h in f.hosts} == {"ibp0s0"}
    for h in f.hosts:  # each host on the switch the dump cables its CA to
        link = next(lk for lk in f.links if lk.a == f"{h.host}:mlx5_0/1")
        assert result.guids[link.b] == leaf_of[h.host].guid
        assert link.speed in ("QDR", "DDR") and link.width == "4x"
    rules = Counter((u.rule, u.device) for u in result.unknowns)
    for hca in H100_IB_HCAS[1:]:
        assert rules[("not_in_switch_graph", f"{hca}/1")] == 86
    assert rules[("not_compute", "mlx5_bond_0/1")] == 86
    assert len(result.unknowns) == 86 * 8
    line = next(u for u in result.unknowns if u.host == "x5570comp1" and u.device == "mlx5_4/1")
    assert line.line().startswith("x5570comp1 mlx5_4/1: not_in_switch_graph: no cable found")
    assert (
        result.guids["x5570comp1:mlx5_0/1"]
        == topo.port_guids[
            next((n.index, 1) for n in topo.nodes if gmap.get(n.guid) == "x5570comp1")
        ]
    )
    assert any("match no reporting host" in n for n in result.notes)  # CAs not in the map
    tiers = Counter(s.role for s in f.switches)
    assert tiers["leaf"] >= 1 and tiers["leaf"] + tiers["spine"] == 11
    _served(tmp_path, result)


@pytest.mark.parametrize(
    ("net", "hosts", "placed", "unknown"),
    [
        # one switch, two single-port HCAs: both on rail 0
        ("net.1", {"Hca1": 1, "Hca2": 1}, {"Hca1": [0], "Hca2": [0]}, {}),
        # two dual-port HCAs, both ports on one switch each: the second port of each is wiring
        # that is not rail-optimized
        (
            "net.2sw2path4hca2port",
            {"Hca1": 2, "Hca2": 2},
            {"Hca1": [0], "Hca2": [0]},
            {
                ("Hca1", "mlx5_1/1"): "not_rail_optimized",
                ("Hca2", "mlx5_1/1"): "not_rail_optimized",
                (None, "Switch1"): "leaf_numbering",
                (None, "Switch2"): "leaf_numbering",
            },
        ),
    ],
)
def test_the_h100_tree_joined_with_ibsim_nets(
    tmp_path: Path,
    h100: Path,
    fixtures_real: Path,
    net: str,
    hosts: dict[str, int],
    placed: dict[str, list[int]],
    unknown: dict[tuple[str, str], str],
) -> None:
    """ibsim's nets name CAs ("Hca1") but no devices or GUIDs: a host named so is matched by
    position (its first IB ports in name order), with a warning naming it."""
    path = fixtures_real / "linux-rdma-ibsim" / net
    topo = parse_ibnetdiscover(path.read_text(), source=net)
    reports = []
    for host, n_ports in hosts.items():
        tree = tmp_path / host / "infiniband"
        shutil.copytree(h100, tree)
        for hca in H100_IB_HCAS[n_ports:]:  # the net gives the host this many cabled ports
            shutil.rmtree(tree / hca)
        reports.append(_report(host, tree))
    result = discover_fabric(
        reports,
        from_ibnetdiscover(topo),
        rail_prefix="10.100.0.0/16",
        endpoint_prefix="10.200.0.0/16",
    )
    assert result.fabric is not None
    assert {h.host: [c.rail for c in h.hcas] for h in result.fabric.hosts} == placed
    got = {(u.host, u.device): u.rule for u in result.unknowns if u.rule != "not_compute"}
    assert got == unknown
    assert all("matched to the switch graph by position" in w for w in result.warnings[-2:])
    _served(tmp_path, result)


# --------------------------------------------------------------------------------------------
# LLDP (RoCE), from lldpctl captures


def _roce_host(name: str, netdev: str, address: str, rail: int = 0) -> HostDiscovery:
    return HostDiscovery(
        host=name,
        ports=[RdmaPortFacts(hca="mlx5_0", link_layer=LinkLayer.ETHERNET, netdev=netdev)],
        netdevs=[NetdevFacts(name=netdev, kind="ether", ipv4=[ipaddress.IPv4Interface(address)])],
    )


def test_lldp_places_roce_ports_on_the_leaf_their_neighbour_names() -> None:
    """The real lldpctl captures: gpu000's vB sees su0-leaf0's vA; the host's own address and
    prefix make the rail subnet; the leaf's own table (two hosts) adds no switch cable."""
    host = _roce_host("gpu000", "vB", "10.100.0.1/24").model_copy(
        update={"lldp": read_lldp_file(LLDP / "host-one-neighbour.json")}
    )
    leaf = read_lldp_file(LLDP / "leaf-two-neighbours.json")
    graph = from_lldp({"gpu000": host.lldp}, {"su0-leaf0": leaf})
    result = discover_fabric([host], graph, endpoint_prefix="10.200.0.0/16")
    f = result.fabric
    assert f is not None and [s.name for s in f.switches] == ["su0-leaf0"]
    assert f.switches[0].role == "leaf" and f.switches[0].rail == 0
    assert f.rail_subnets == {0: ipaddress.IPv4Network("10.100.0.0/24")}
    (hca,) = f.hosts[0].hcas
    assert (hca.netdev, str(hca.address), hca.link_layer) == ("vB", "10.100.0.1", "Ethernet")
    (link,) = f.links
    assert (link.a, link.b, link.kind) == ("gpu000:mlx5_0/1", "su0-leaf0", "host-leaf")
    # gpu001 is in the leaf's table but reported nothing: it is not a switch cable
    assert graph.links == []


def test_lldp_switch_tables_give_the_spine_cables() -> None:
    """A spine's own table: a leaf the hosts named is a switch cable, so is an unnamed
    neighbour that says it bridges; a neighbour that is neither (a host that reported
    nothing, capability Station as lldpd on a Linux host sends) is left out with a note."""
    (seen,) = read_lldp_file(LLDP / "host-one-neighbour.json")  # su0-leaf0, Station only
    hosts = {"h0": [seen]}
    spine = [
        seen.model_copy(update={"netdev": "swp1"}),
        seen.model_copy(update={"netdev": "swp2", "system": "su1-leaf0", "port": "swp30"}),
        seen.model_copy(
            update={"netdev": "swp3", "system": "su2-leaf0", "capabilities": ["Bridge"]}
        ),
    ]
    graph = from_lldp(hosts, {"spine-x": spine})
    assert [(lk.a, lk.a_port, lk.b, lk.b_port) for lk in graph.links] == [
        ("spine-x", 1, "su0-leaf0", None),  # the leaf's port is named vA: no number
        ("spine-x", 3, "su2-leaf0", None),
    ]
    assert any("spine-x swp2: su1-leaf0" in n for n in graph.notes)


# --------------------------------------------------------------------------------------------
# the rules, one minimal case each


def _ib(hca: str, netdev: str | None, guid: str) -> RdmaPortFacts:
    return RdmaPortFacts(
        hca=hca, link_layer=LinkLayer.INFINIBAND, netdev=netdev, node_guid=guid, port_guid=guid
    )


def _dump(cables: list[tuple[str, str, int]]) -> str:
    """An ibnetdiscover text: switches by name, each CA (guid) cabled to switch port."""
    switches: dict[str, list[tuple[int, str]]] = {}
    for guid, sw, port in cables:
        switches.setdefault(sw, []).append((port, guid))
    out = []
    for i, (sw, ports) in enumerate(switches.items()):
        out.append(f'switchguid=0x{i + 1:016x}\nSwitch\t36 "S-{i + 1:016x}"\t\t# "{sw}"')
        out += [f'[{p}]\t"H-{g}"[1]' for p, g in ports]
        out.append("")
    for guid, sw, port in cables:
        i = list(switches).index(sw)
        out.append(f'caguid=0x{guid}\nCa\t1 "H-{guid}"\t\t# "x"')
        out.append(f'[1]({guid})\t"S-{i + 1:016x}"[{port}]\n')
    return "\n".join(out)


def test_each_rule_leaves_its_port_out_and_names_it() -> None:
    g = {n: f"{k:016x}" for k, n in enumerate(["a0", "a1", "a2", "a3", "b0", "b1", "b2"], 1)}
    a = HostDiscovery(
        host="a",
        ports=[
            _ib("mlx5_0", "ib0", g["a0"]),
            _ib("mlx5_1", "ib1", g["a1"]),
            _ib("mlx5_2", None, g["a2"]),  # on leaf-1 too: no netdev
            _ib("mlx5_3", "ib3", g["a3"]),  # enslaved to a bond
            RdmaPortFacts(hca="mlx5_bond_0", link_layer=LinkLayer.ETHERNET, netdev="bond0"),
        ],
        netdevs=[
            NetdevFacts(name="ib0", kind="ipoib", ipv4=[ipaddress.IPv4Interface("10.1.0.1/24")]),
            NetdevFacts(name="ib1", kind="ipoib", ipv4=[ipaddress.IPv4Interface("10.1.1.1/24")]),
            NetdevFacts(name="ib3", kind="ipoib", bond_master="bond1"),
            NetdevFacts(name="bond1", kind="bond", bond_members=["ib3"]),
            NetdevFacts(name="bond0", kind="bond", default_route=True),
        ],
    )
    b = HostDiscovery(
        host="b",
        ports=[
            _ib("mlx5_0", "ib0", g["b0"]),
            _ib("mlx5_1", "ib1", g["b1"]),  # cabled to leaf-0 as well: not rail-optimized
            _ib("mlx5_2", "ib2", g["b2"]),  # no address, no plan
        ],
        netdevs=[
            NetdevFacts(name="ib0", kind="ipoib", ipv4=[ipaddress.IPv4Interface("10.1.0.2/24")]),
            NetdevFacts(name="ib1", kind="ipoib", ipv4=[ipaddress.IPv4Interface("10.1.1.2/24")]),
            NetdevFacts(name="ib2", kind="ipoib"),
        ],
    )
    c = HostDiscovery(host="c", ports=[_ib("mlx5_0", "ib0", "00000000000000ff")])  # no cable
    # the netdev sysfs does not show, pinned in the agent's ports: config, is the port's
    d_inv = HostInventory(host="d", hcas=[HCAInfo(hca="mlx5_0", rail=0, netdev="ibp9")])
    d = HostDiscovery(host="d", inventory=d_inv, ports=[_ib("mlx5_0", None, "00000000000000dd")])
    dump = _dump(
        [
            (g["a0"], "leaf-0", 1),
            (g["a1"], "leaf-1", 1),
            (g["a2"], "leaf-2", 1),
            (g["a3"], "leaf-3", 1),
            (g["b0"], "leaf-0", 2),
            (g["b1"], "leaf-0", 3),
            (g["b2"], "leaf-2", 2),
            ("00000000000000dd", "leaf-0", 4),
        ]
    )
    graph = from_ibnetdiscover(parse_ibnetdiscover(dump, source="t"))
    result = discover_fabric([a, b, c, d], graph)
    got = {(u.host, u.device): u.rule for u in result.unknowns}
    assert got == {
        ("a", "mlx5_2/1"): "no_netdev",
        ("a", "mlx5_3/1"): "lag_member",
        ("a", "mlx5_bond_0/1"): "management",
        ("b", "mlx5_1/1"): "not_rail_optimized",
        ("b", "mlx5_2/1"): "no_address",
        ("c", "mlx5_0/1"): "not_in_switch_graph",
        ("a", None): "no_endpoints",
        ("b", None): "no_endpoints",
        ("d", "mlx5_0/1"): "no_address",  # its pinned netdev ibp9 has none: not no_netdev
        (None, "S-0000000000000001"): "leaf_numbering",
    }
    assert result.fabric is None  # no host has endpoints and none was planned
    planned = discover_fabric([a, b, c], graph, endpoint_prefix="10.200.0.0/16")
    f = planned.fabric
    assert f is not None
    assert {h.host: [(c.hca, c.rail) for c in h.hcas] for h in f.hosts} == {
        "a": [("mlx5_0", 0), ("mlx5_1", 1)],
        "b": [("mlx5_0", 0)],
    }
    assert f.rail_subnets == {
        0: ipaddress.IPv4Network("10.1.0.0/24"),
        1: ipaddress.IPv4Network("10.1.1.0/24"),
    }
    assert [len(h.endpoints) for h in f.hosts] == [2, 1]


def test_a_leaf_whose_hosts_number_it_differently_takes_the_majority() -> None:
    """Three hosts call their leaf-0 port rail 0, one calls it rail 1 (another PCI order):
    every port on leaf-0 is rail 0, and the leaf is named with the counts."""
    hosts, cables = [], []
    for h in range(4):
        swap = h == 3
        ports = [_ib("mlx5_0", "ib0", f"{h:08x}00000000"), _ib("mlx5_1", "ib1", f"{h:08x}00000001")]
        hosts.append(HostDiscovery(host=f"h{h}", ports=ports))
        cables += [
            (f"{h:08x}0000000{int(swap)}", "leaf-0", h + 1),
            (f"{h:08x}0000000{int(not swap)}", "leaf-1", h + 1),
        ]
    graph = from_ibnetdiscover(parse_ibnetdiscover(_dump(cables), source="t"))
    result = discover_fabric(
        hosts, graph, rail_prefix="10.100.0.0/16", endpoint_prefix="10.200.0.0/16"
    )
    f = result.fabric
    assert f is not None
    assert [(c.hca, c.rail) for c in f.host("h3").hcas] == [("mlx5_1", 0), ("mlx5_0", 1)]
    assert [(c.hca, c.rail) for c in f.host("h0").hcas] == [("mlx5_0", 0), ("mlx5_1", 1)]
    details = {u.device: u.detail for u in result.unknowns if u.rule == "leaf_numbering"}
    assert len(result.unknowns) == len(details) == 2
    assert (
        "(3 as their rail 0, 1 as their rail 1); the leaf is rail 0"
        in details["S-0000000000000001"]
    )
    assert (
        "(1 as their rail 0, 3 as their rail 1); the leaf is rail 1"
        in details["S-0000000000000002"]
    )


def test_bad_prefixes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="rail prefix 'nope'"):
        discover_fabric([], from_lldp({}), rail_prefix="nope")
