"""Fabric model, rail-optimized generator and fabric files."""

from __future__ import annotations

import ipaddress
import json
from collections import Counter

import pytest
from pydantic import ValidationError

from linkguard.models import HostInventory
from linkguard.topology.fabric import (
    Fabric,
    FabricError,
    dump_fabric,
    generate_rail_optimized,
    load_fabric,
)

IP = ipaddress.IPv4Address

SMALL_YAML = """\
name: lab
hosts:
  - host: h0
    hcas:
      - {hca: mlx5_0, rail: 0, netdev: rail0, numa_node: 0, address: 10.100.0.1}
      - {hca: mlx5_1, rail: 1, netdev: rail1, numa_node: 1, address: 10.100.1.1}
    endpoints: [10.200.0.1, 10.200.0.2]
    gpu_numa: [0, 1]
  - host: h1
    hcas:
      - {hca: mlx5_0, rail: 0, netdev: rail0, numa_node: 0, address: 10.100.0.2}
      - {hca: mlx5_1, rail: 1, netdev: rail1, numa_node: 1, address: 10.100.1.2}
    endpoints: [10.200.1.1, 10.200.1.2]
switches:
  - {name: leaf0, role: leaf, rail: 0, su: 0}
  - {name: leaf1, role: leaf, rail: 1, su: 0}
links:
  - {a: "h0:mlx5_0/1", b: leaf0, kind: host-leaf, rail: 0, rate_gbps: 400}
  - {a: "h1:mlx5_1/1", b: leaf1, kind: host-leaf, rail: 1, rate_gbps: 400}
"""


@pytest.fixture(scope="module")
def su() -> Fabric:
    return generate_rail_optimized()


def test_generator_shape(su: Fabric) -> None:
    assert len(su.hosts) == 32
    assert su.rails == list(range(8))
    assert sum(len(h.endpoints) for h in su.hosts) == 256
    leaves = [s for s in su.switches if s.role == "leaf"]
    spines = [s for s in su.switches if s.role == "spine"]
    assert [s.name for s in leaves] == [f"su0-leaf{r}" for r in range(8)]
    assert [(s.rail, s.su) for s in leaves] == [(r, 0) for r in range(8)]
    assert [s.name for s in spines] == [f"su0-spine{k}" for k in range(4)]
    kinds = Counter(link.kind for link in su.links)
    assert kinds == {"host-leaf": 256, "leaf-spine": 32}
    assert {link.rate_gbps for link in su.links} == {400.0}


def test_generator_addresses_and_numa(su: Fabric) -> None:
    h5 = su.host("gpu005")
    assert [c.hca for c in h5.hcas] == [f"mlx5_{r}" for r in range(8)]
    assert [c.netdev for c in h5.hcas] == [f"rail{r}" for r in range(8)]
    assert h5.hcas[3].address == IP("10.100.3.6")
    assert h5.endpoints[2] == IP("10.200.5.3")
    assert su.host("gpu000").endpoints[0] == IP("10.200.0.1")
    assert su.host("gpu031").hcas[7].address == IP("10.100.7.32")
    assert [c.numa_node for c in h5.hcas] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert h5.gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]
    cable = next(link for link in su.links if link.a == "gpu005:mlx5_3/1")
    assert (cable.b, cable.kind, cable.rail) == ("su0-leaf3", "host-leaf", 3)


def test_generator_multi_su_and_larger_layout() -> None:
    f = generate_rail_optimized(hosts=300, rails=4, gpus_per_host=8, hosts_per_su=32)
    assert len([s for s in f.switches if s.role == "leaf"]) == 10 * 4
    cable = next(link for link in f.links if link.a == "gpu040:mlx5_3/1")
    assert cable.b == "su1-leaf3"
    # 300 hosts: each rail gets a /23 (512 addresses); host h is the (h+1)-th address.
    assert f.host("gpu299").hcas[1].address == IP("10.100.3.44")  # 10.100.2.0 + 300
    # 300 hosts x 256 > /16: 128 endpoint addresses per host; GPU 7 of host 299.
    assert f.host("gpu299").endpoints[7] == IP("10.200.149.136")  # 299 * 128 + 8
    # GPUs beyond the rails: home rail g % 4, NUMA split over the 8 GPUs.
    assert f.host("gpu000").gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]


def test_generator_refuses_too_small_prefix() -> None:
    with pytest.raises(ValueError, match="too small"):
        generate_rail_optimized(hosts=300, rail_prefix="10.100.0.0/21")
    with pytest.raises(ValueError, match="too small"):
        generate_rail_optimized(hosts=40, endpoint_prefix="10.200.0.0/24")


def test_host_lookup_and_duplicates(su: Fabric) -> None:
    with pytest.raises(KeyError, match="no host 'nope' in fabric 'rail-optimized-32x8'"):
        su.host("nope")
    hosts = [su.hosts[0], su.hosts[0]]
    with pytest.raises(ValidationError, match="duplicate host 'gpu000'"):
        Fabric(name="x", hosts=hosts)
    clash = HostInventory.model_validate(
        {**su.hosts[1].model_dump(), "endpoints": [str(su.hosts[0].endpoints[0])], "gpu_numa": []}
    )
    with pytest.raises(ValidationError, match=r"duplicate address 10\.200\.0\.1"):
        Fabric(name="x", hosts=[su.hosts[0], clash])
    short = HostInventory.model_validate({**su.hosts[1].model_dump(), "gpu_numa": [0]})
    with pytest.raises(ValidationError, match="gpu_numa has 1 entries for 8 endpoints"):
        Fabric(name="x", hosts=[short])


def test_load_yaml_and_round_trip(tmp_path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(SMALL_YAML)
    f = load_fabric(path)
    assert f.host_names == ["h0", "h1"]
    assert f.host("h1").hcas[1].address == IP("10.100.1.2")
    assert f.rails == [0, 1]
    for fmt, suffix in (("yaml", ".yaml"), ("json", ".json")):
        out = tmp_path / f"again{suffix}"
        out.write_text(dump_fabric(f, fmt))
        assert load_fabric(out) == f
    json.loads(dump_fabric(f, "json"))


BAD = {
    "missing-field": (
        ("rail: 0, netdev: rail0, numa_node: 0, address: 10.100.0.1", "netdev: rail0"),
        r"hosts\.0\.hcas\.0\.rail: Field required",
    ),
    "dup-host": (("host: h1", "host: h0"), "duplicate host 'h0'"),
    "dup-address": (("10.200.1.2]", "10.200.0.2]"), r"duplicate address 10\.200\.0\.2"),
    "no-address": ((", address: 10.100.1.2}", "}"), r"mlx5_1/1 \(rail 1\) has no address"),
    "bad-link": (("b: leaf1", "b: leaf9"), "unknown end 'leaf9'"),
    "not-yaml": (("links:\n", "links: [\n  - {a: b, c: [\n"), "not valid YAML"),
    "scalar": ((SMALL_YAML, "just a string\n"), "expected a mapping"),
}


@pytest.mark.parametrize(("change", "expect"), BAD.values(), ids=BAD.keys())
def test_bad_files(tmp_path, change, expect) -> None:
    path = tmp_path / "bad.yaml"
    text = SMALL_YAML.replace(*change)
    assert text != SMALL_YAML
    path.write_text(text)
    with pytest.raises(FabricError, match=expect) as info:
        load_fabric(path)
    assert str(path) in str(info.value)


def test_bad_paths(tmp_path) -> None:
    with pytest.raises(FabricError, match="cannot read"):
        load_fabric(tmp_path / "absent.json")
    (tmp_path / "f.txt").write_text("{}")
    with pytest.raises(FabricError, match="suffix"):
        load_fabric(tmp_path / "f.txt")
    (tmp_path / "f.json").write_text("{not json")
    with pytest.raises(FabricError, match="not valid JSON"):
        load_fabric(tmp_path / "f.json")
