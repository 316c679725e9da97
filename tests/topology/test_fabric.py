"""Fabric model and fabric files (the generator: test_generator.py)."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml
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


def _doc(**gen) -> dict:
    return yaml.safe_load(dump_fabric(generate_rail_optimized(**gen), "yaml"))


def test_hca_rail_must_match_its_link(tmp_path) -> None:
    doc = _doc(hosts=2, rails=2)
    # without endpoint and rail subnets (a hand-written fabric): the moved HCA would otherwise
    # first trip the subnet checks (its GPUs' home rails change with it, rail 7 has no subnet)
    del doc["endpoint_subnets"], doc["rail_subnets"]
    doc["hosts"][1]["hcas"][0]["rail"] = 7
    bad = tmp_path / "f.yaml"
    bad.write_text(yaml.safe_dump(doc))
    for observed in (False, True):  # the file contradicts itself: observed or not
        with pytest.raises(FabricError, match="HCA is on rail 7 but the link says rail 0"):
            load_fabric(bad, observed=observed)


def test_observed_fabric_may_cable_an_hca_to_another_rails_leaf(tmp_path) -> None:
    doc = _doc(hosts=2, rails=2)
    [moved] = [x for x in doc["links"] if x["a"] == "gpu001:mlx5_0/1"]
    moved["b"] = "su0-leaf1"  # the rail-0 HCA on the rail-1 leaf, as an audit would find it
    path = tmp_path / "observed.yaml"
    path.write_text(yaml.safe_dump(doc))
    expect = r"gpu001:mlx5_0/1 - su0-leaf1: the HCA is on rail 0 but the leaf says rail 1"
    with pytest.raises(FabricError, match=expect):
        load_fabric(path)  # an expected fabric (and the service's) stays strict
    f = load_fabric(path, observed=True)
    assert [(x.b, x.rail) for x in f.links if x.a == "gpu001:mlx5_0/1"] == [("su0-leaf1", 0)]
    assert Fabric.model_validate(doc, context={"observed": True}) == f
    with pytest.raises(ValidationError, match=expect):
        Fabric.model_validate(doc)
    # every other check still applies to an observed fabric
    doc["hosts"][1]["hcas"][0]["address"] = "10.100.5.2"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(FabricError, match=r"10.100.5.2 is not a host address of rail 0's"):
        load_fabric(path, observed=True)


def test_rail_subnets_must_cover_every_rail(tmp_path) -> None:
    doc = _doc(hosts=2, rails=3)
    del doc["rail_subnets"]["1"]
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        FabricError,
        match=r"rail 1 has no entry in rail_subnets \(host gpu000: "
        r"HCA mlx5_1/1 is on it; there are subnets for rails 0, 2\)",
    ):
        load_fabric(path)
    del doc["rail_subnets"]  # none at all: addresses are not checked against subnets
    path.write_text(yaml.safe_dump(doc))
    assert load_fabric(path).rail_subnets == {}


def test_yaml_files_are_read_with_libyaml_when_pyyaml_has_it(tmp_path) -> None:
    from linkguard.topology import fabric as module

    # libyaml's loader reads a 2,048-host file ~3x faster than the pure-Python one (27 s)
    assert module._YAML_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    # still a safe loader: no Python objects from a fabric file
    path = tmp_path / "evil.yaml"
    path.write_text(SMALL_YAML.replace("name: lab", "name: !!python/object/apply:os.getcwd []"))
    with pytest.raises(FabricError, match="not valid YAML"):
        load_fabric(path)


def test_hca_address_must_be_in_its_rail_subnet(tmp_path) -> None:
    fabric = generate_rail_optimized(hosts=2, rails=2)
    assert {r: str(n) for r, n in fabric.rail_subnets.items()} == {
        0: "10.100.0.0/24",
        1: "10.100.1.0/24",
    }
    doc = yaml.safe_load(dump_fabric(fabric, "yaml"))
    doc["hosts"][1]["hcas"][0]["address"] = "10.100.5.2"
    bad = tmp_path / "f.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(FabricError, match=r"10.100.5.2 is not a host address of rail 0's subnet"):
        load_fabric(bad)


ENDPOINT_SUBNETS_BAD = {
    "outside-home-subnet": (
        lambda d: d["hosts"][1]["endpoints"].__setitem__(0, "10.200.1.9"),
        "host gpu001: GPU 0 endpoint 10.200.1.9 is not in its home rail 0's endpoint subnet "
        "10.200.0.0/24",
    ),
    "overlapping": (
        lambda d: d["endpoint_subnets"].__setitem__("1", "10.200.0.128/25"),
        r"endpoint subnets of rails 0 \(10.200.0.0/24\) and 1 \(10.200.0.128/25\) overlap",
    ),
    "overlaps-a-rail-subnet": (
        lambda d: d["endpoint_subnets"].__setitem__("1", "10.100.1.0/24"),
        r"endpoint subnet of rail 1 \(10.100.1.0/24\) overlaps rail 1's subnet 10.100.1.0/24",
    ),
    "home-rail-without-subnet": (
        lambda d: d["endpoint_subnets"].pop("1"),
        "host gpu000: GPU 1's home rail 1 has no endpoint subnet",
    ),
}


@pytest.mark.parametrize(
    ("change", "expect"), ENDPOINT_SUBNETS_BAD.values(), ids=ENDPOINT_SUBNETS_BAD.keys()
)
def test_endpoint_subnets_are_checked(tmp_path, change, expect) -> None:
    fabric = generate_rail_optimized(hosts=2, rails=2)
    doc = yaml.safe_load(dump_fabric(fabric, "yaml"))
    assert doc["endpoint_subnets"] == {"0": "10.200.0.0/24", "1": "10.200.1.0/24"}
    assert doc["hosts"][1]["endpoints"] == ["10.200.0.2", "10.200.1.2"]
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(doc))
    assert load_fabric(good) == fabric
    change(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(FabricError, match=expect) as info:
        load_fabric(bad)
    assert str(bad) in str(info.value)
    # the same refusal when the model is built in code
    with pytest.raises(ValidationError, match=expect):
        Fabric.model_validate(doc)


# --------------------------------------------------------------------------------------------
# Files that validated but gave bad plans: refused now


def _set_netdev(d: dict) -> None:
    d["hosts"][0]["hcas"][1]["netdev"] = "rail0"


def _cable_twice(d: dict) -> None:
    d["links"].append({**d["links"][0], "b": "su0-leaf1"})


def _self_loop(d: dict) -> None:
    d["links"].append({"a": "su0-spine0", "b": "su0-spine0", "kind": "spine-spine"})


def _set_subnet(key: str, net: str, field: str = "rail_subnets"):
    return lambda d: d[field].__setitem__(key, net)


def _one_subnet_for_all(d: dict) -> None:
    d["rail_subnets"] = {"0": "10.100.0.0/16", "1": "10.100.0.0/16"}


PLAN_BREAKERS = {
    "shared-netdev": (
        _set_netdev,
        r"host gpu000: HCAs mlx5_0/1 and mlx5_1/1 both have netdev 'rail0'",
    ),
    "hca-port-cabled-twice": (
        _cable_twice,
        r"links\[\d+\]: HCA port gpu000:mlx5_0/1 is already cabled by links\[0\] "
        r"\(gpu000:mlx5_0/1 - su0-leaf0\); an HCA port takes one cable",
    ),
    "self-loop": (_self_loop, r"links\[\d+\]: both ends are 'su0-spine0'"),
    "rail-below-0": (
        _set_subnet("-1", "10.100.9.0/24"),
        r"rail_subnets\.-1\.\[key\]: Input should be greater than or equal to 0",
    ),
    "rail-above-63": (
        _set_subnet("64", "10.100.9.0/24", "endpoint_subnets"),
        r"endpoint_subnets\.64\.\[key\]: Input should be less than or equal to 63",
    ),
    "overlapping-rail-subnets": (
        _one_subnet_for_all,
        r"rail subnets of rails 0 \(10.100.0.0/16\) and 1 \(10.100.0.0/16\) overlap",
    ),
    "host-bits-set": (
        _set_subnet("1", "10.100.1.5/24"),
        r"rail_subnets: rail 1's subnet 10.100.1.5/24 has host bits set \(the network is "
        r"10.100.1.0/24\)",
    ),
    "endpoint-host-bits-set": (
        _set_subnet("0", "10.200.0.9/24", "endpoint_subnets"),
        r"rail 0's endpoint subnet 10.200.0.9/24 has host bits set",
    ),
}


@pytest.mark.parametrize(("change", "expect"), PLAN_BREAKERS.values(), ids=PLAN_BREAKERS.keys())
def test_fabrics_that_give_bad_plans_are_refused(tmp_path, change, expect) -> None:
    doc = _doc(hosts=2, rails=2)
    change(doc)
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(doc))
    for observed in (False, True):  # none of these is a cabling fault an audit reports
        with pytest.raises(FabricError, match=expect) as info:
            load_fabric(path, observed=observed)
        assert str(path) in str(info.value)


def test_distinct_netdevs_and_subnets_still_load(tmp_path) -> None:
    doc = _doc(hosts=2, rails=2)
    assert [c["netdev"] for c in doc["hosts"][0]["hcas"]] == ["rail0", "rail1"]
    # netdevs may repeat across hosts, and may be left out (an imported fabric has none)
    for c in doc["hosts"][1]["hcas"]:
        del c["netdev"]
    doc["rail_subnets"]["1"] = "10.100.1.0/255.255.255.0"  # a netmask is fine without host bits
    f = Fabric.model_validate(doc)
    assert f.rail_subnets[1] == ipaddress.IPv4Network("10.100.1.0/24")
    assert [c.netdev for c in f.host("gpu001").hcas] == [None, None]


def test_serving_problems_name_the_first_hcas_and_hosts(tmp_path) -> None:
    from linkguard.topology.fabric import check_servable, serving_problems

    generated = generate_rail_optimized(hosts=4, rails=2)
    assert serving_problems(generated) == []
    assert check_servable(generated, "gen.yaml") is generated
    doc = _doc(hosts=4, rails=2)
    for h in doc["hosts"]:
        for c in h["hcas"]:
            del c["netdev"]
        h["endpoints"], h["gpu_numa"] = [], []
    del doc["endpoint_subnets"]
    bare = Fabric.model_validate(doc)  # a valid fabric: the importer makes such ones
    assert serving_problems(bare) == [
        "8 HCA port(s) without a netdev (gpu000:mlx5_0/1, gpu000:mlx5_1/1, gpu001:mlx5_0/1 and "
        "5 more): set each HCA's netdev (the interface its rail's routes leave by, e.g. ib0 or "
        "ens3np0)",
        "4 host(s) without GPU endpoints (gpu000, gpu001, gpu002 and 1 more): set each host's "
        "endpoints (one address per GPU, index = GPU)",
    ]
    with pytest.raises(FabricError) as info:
        check_servable(bare, "imported.yaml")
    assert str(info.value) == (
        "imported.yaml: the topology service cannot serve this fabric: "
        + "; ".join(serving_problems(bare))
        + ". A fabric imported from ibnetdiscover has neither: fill in the netdevs and endpoints "
        "(or generate one with `linkguard fabric generate`)"
    )
