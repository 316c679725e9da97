"""What a host reports for discovery: GUIDs from sysfs text, the RDMA ports of the real H100
tree, bonds from a class/net tree, rtnetlink's interfaces in a real namespace, lldpctl JSON."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
from pathlib import Path

import pytest

from linkguard.drivers.hostfacts import guid_from_text, read_host_facts, read_netlink_netdevs
from linkguard.drivers.lldp import LldpError, parse_lldpctl_json, read_lldp_file, run_lldpctl
from tests.support import H100, H100_IB_HCAS, netns_with

LLDP = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"


@pytest.mark.parametrize(
    ("text", "guid"),
    [
        ("0c42:a103:00b5:1234\n", "0c42a10300b51234"),
        ("fe80:0000:0000:0000:0c42:a103:00b5:1235", "0c42a10300b51235"),  # a GID: low 64 bits
        ("fe80::1", None),  # compressed: not what sysfs prints
        ("0000:0000:0000:0000", None),
        ("zz42:a103:00b5:1234", None),
        ("", None),
        (None, None),
    ],
)
def test_guid_from_text(text: str | None, guid: str | None) -> None:
    assert guid_from_text(text) == guid


def test_the_real_h100_tree_lists_every_port_with_its_kind(
    tmp_path: Path, fixtures_real: Path
) -> None:
    """Nine devices, the bond among them (Ethernet); gpud's copy has no node_guid and no gids:
    the GUIDs are unknown, not an error. One written node_guid is read."""
    tree = tmp_path / "infiniband"
    shutil.copytree(fixtures_real / H100, tree)
    (tree / "mlx5_4" / "node_guid").write_text("0c42:a103:00b5:1234\n")
    facts = read_host_facts(tree, tmp_path / "net")
    assert [p.hca for p in facts.ports] == [*H100_IB_HCAS, "mlx5_bond_0"]
    bond = facts.ports[-1]
    assert (bond.link_layer, bond.rate_gbps) == ("Ethernet", 200.0)
    assert {p.link_layer for p in facts.ports[:-1]} == {"InfiniBand"}
    assert {p.rate_gbps for p in facts.ports[:-1]} == {400.0}
    assert [p.node_guid for p in facts.ports].count("0c42a10300b51234") == 1
    assert all(p.port_guid is None for p in facts.ports)
    assert facts.netdevs == []
    # each IB port without a GUID is named: it cannot be matched to a dump by GUID
    unmatched = [x for x in facts.problems if "no node_guid or gids/0 GUID" in x]
    assert len(unmatched) == 7 and not any("mlx5_4/" in x for x in unmatched)


def test_bonds_and_ipoib_from_a_class_net_tree(tmp_path: Path) -> None:
    """``/sys/class/net`` as the kernel lays it out: a bond with ``bonding/slaves``, its
    members' ``master`` links, an IPoIB netdev (type 32) and an unreadable carrier."""
    net = tmp_path / "net"
    for name, kind in (("bond0", "1"), ("ens1f0", "1"), ("ens1f1", "1"), ("ibp0", "32")):
        (net / name).mkdir(parents=True)
        (net / name / "type").write_text(kind + "\n")
        (net / name / "carrier").write_text("1\n")
    (net / "bond0" / "bonding").mkdir()
    (net / "bond0" / "bonding" / "slaves").write_text("ens1f0 ens1f1\n")
    for m in ("ens1f0", "ens1f1"):
        os.symlink("../bond0", net / m / "master")
    (net / "ibp0" / "carrier").write_text("")  # reads fail with EINVAL when down: unknown
    facts = read_host_facts(tmp_path / "no-ib", net)
    got = {n.name: (n.kind, n.bond_master, n.bond_members, n.carrier) for n in facts.netdevs}
    assert got == {
        "bond0": ("bond", None, ["ens1f0", "ens1f1"], True),
        "ens1f0": ("ether", "bond0", [], True),
        "ens1f1": ("ether", "bond0", [], True),
        "ibp0": ("ipoib", None, [], None),
    }


def test_rtnetlink_interfaces_of_a_real_namespace() -> None:
    """Addresses, carrier and the default route's interface, read in a namespace the test
    makes (a veth pair, one end up with an address and the default route)."""
    cmds = [
        "link add ra type veth peer name rb",
        "addr add 10.77.0.5/24 dev ra",
        "link set ra up",
        "link set rb up",
        "route add default via 10.77.0.1 dev ra",
    ]
    with netns_with("lg-facts", cmds) as ns:
        got = asyncio.run(read_netlink_netdevs(ns))
    by = {n.name: n for n in got}
    assert set(by) == {"ra", "rb"}  # lo left out
    assert by["ra"].ipv4 == [ipaddress.IPv4Interface("10.77.0.5/24")]
    assert (by["ra"].default_route, by["rb"].default_route) == (True, False)
    assert (by["ra"].carrier, by["ra"].kind) == (True, "ether")
    with pytest.raises(OSError, match="does not exist"):
        asyncio.run(read_netlink_netdevs(ns))


def test_lldpctl_json_one_interface_several_and_none() -> None:
    (one,) = read_lldp_file(LLDP / "host-one-neighbour.json")
    assert (one.netdev, one.system, one.port, one.port_descr) == ("vB", "su0-leaf0", "vA", "vA")
    assert one.chassis_id == "5e:68:0d:7e:c1:9d" and one.capabilities == ["Station"]
    assert not one.switching
    (named,) = read_lldp_file(LLDP / "host-one-neighbour-ifname.json")
    assert named.port == "vA"  # the id, an ifname
    two = read_lldp_file(LLDP / "leaf-two-neighbours.json")
    assert [(n.netdev, n.system, n.port) for n in two] == [
        ("vA", "gpu000", "vB"),
        ("vA2", "gpu001", "vC"),
    ]
    assert parse_lldpctl_json('{"lldp": {}}') == []  # lldpd running, no neighbour yet
    # a chassis without a system name, a port id that is a MAC and no descr, a bad ifname
    text = (
        '{"lldp": {"interface": [{"eth0": {"chassis": {"id": {"type": "mac", "value": "aa"},'
        ' "capability": [{"type": "Bridge", "enabled": true}]}, "port": {"id": {"type": '
        '"mac", "value": "bb"}}}}, {"bad name!": {}}]}}'
    )
    (bare,) = parse_lldpctl_json(text)
    assert (bare.system, bare.chassis_id, bare.port, bare.switching) == (None, "aa", "bb", True)


@pytest.mark.parametrize(
    ("text", "match"),
    [("not json", "not lldpctl JSON"), ("[]", "no 'lldp' mapping"), ('{"x": 1}', "no 'lldp'")],
)
def test_bad_lldpctl_output_is_refused_by_source(text: str, match: str) -> None:
    with pytest.raises(LldpError, match=f"src: {match}"):
        parse_lldpctl_json(text, source="src")


def test_lldpctl_that_is_missing_or_fails(tmp_path: Path) -> None:
    with pytest.raises(LldpError, match="not installed"):
        run_lldpctl(("no-such-lldpctl-binary", "-f", "json"))
    with pytest.raises(LldpError, match="exit 1: boom"):
        run_lldpctl(("sh", "-c", "echo boom >&2; exit 1"))
    with pytest.raises(LldpError, match="cannot read"):
        read_lldp_file(tmp_path / "absent.json")
    assert run_lldpctl(("cat", str(LLDP / "leaf-two-neighbours.json")))[1].system == "gpu001"
