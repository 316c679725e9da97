"""Rail-optimized generator: DGX SuperPOD shapes at 1, 2, 4, 16 and 64 SUs, addresses, errors.

Expected counts are the reference architectures' tables (see linkguard.topology.generator):
H100 RA Table 4 (1/2/4 SUs: 256/512/1,024 spine-leaf cables) and the B200 RA table (16 SUs:
64 core switches and 4,096 spine-core cables; 64 SUs: 256 and 16,384).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from collections import Counter

import pytest

from linkguard.topology.fabric import Fabric
from linkguard.topology.fabric import generate_rail_optimized as via_fabric
from linkguard.topology.generator import (
    default_prefix,
    generate_rail_optimized,
    rail_optimized_shape,
)

IP = ipaddress.IPv4Address


def names(f: Fabric, role: str) -> list[str]:
    return [s.name for s in f.switches if s.role == role]


def cables(f: Fabric, kind: str) -> Counter[tuple[str, str]]:
    return Counter((link.a, link.b) for link in f.links if link.kind == kind)


@pytest.fixture(scope="module")
def su() -> Fabric:
    return generate_rail_optimized()


def test_generator_shape(su: Fabric) -> None:
    assert len(su.hosts) == 32
    assert su.rails == list(range(8))
    assert sum(len(h.endpoints) for h in su.hosts) == 256
    leaves = [s for s in su.switches if s.role == "leaf"]
    assert [s.name for s in leaves] == [f"su0-leaf{r}" for r in range(8)]
    assert [(s.rail, s.su) for s in leaves] == [(r, 0) for r in range(8)]
    assert names(su, "spine") == [f"su0-spine{k}" for k in range(4)]
    kinds = Counter(link.kind for link in su.links)
    assert kinds == {"host-leaf": 256, "leaf-spine": 256}  # H100 RA Table 4, 1 SU
    assert {link.rate_gbps for link in su.links} == {400.0}
    # every leaf: 32 uplinks, 8 to each of the SU's 4 spines, tagged with the leaf's rail
    per_pair = cables(su, "leaf-spine")
    assert per_pair == {(f"su0-leaf{r}", f"su0-spine{k}"): 8 for r in range(8) for k in range(4)}
    assert {(link.a, link.rail) for link in su.links if link.kind == "leaf-spine"} == {
        (f"su0-leaf{r}", r) for r in range(8)
    }


def test_generator_addresses_and_numa(su: Fabric) -> None:
    h5 = su.host("gpu005")
    assert [c.hca for c in h5.hcas] == [f"mlx5_{r}" for r in range(8)]
    assert [c.netdev for c in h5.hcas] == [f"rail{r}" for r in range(8)]
    assert h5.hcas[3].address == IP("10.100.3.6")
    # rail-major endpoints: GPU g of host h is 10.200.g.(h+1), in rail g's endpoint subnet
    assert {r: str(n) for r, n in su.endpoint_subnets.items()} == {
        r: f"10.200.{r}.0/24" for r in range(8)
    }
    assert h5.endpoints == [IP(f"10.200.{g}.6") for g in range(8)]
    assert su.host("gpu000").endpoints[0] == IP("10.200.0.1")
    assert su.host("gpu031").endpoints[7] == IP("10.200.7.32")
    assert su.host("gpu031").hcas[7].address == IP("10.100.7.32")
    assert [c.numa_node for c in h5.hcas] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert h5.gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]
    cable = next(link for link in su.links if link.a == "gpu005:mlx5_3/1")
    assert (cable.b, cable.kind, cable.rail) == ("su0-leaf3", "host-leaf", 3)


def test_generator_multi_su_and_larger_layout() -> None:
    f = generate_rail_optimized(hosts=300, rails=4, gpus_per_host=8, hosts_per_su=32)
    assert len(names(f, "leaf")) == 10 * 4
    cable = next(link for link in f.links if link.a == "gpu040:mlx5_3/1")
    assert cable.b == "su1-leaf3"
    # 300 hosts: each rail gets a /23 (512 addresses); host h is the (h+1)-th address.
    assert f.host("gpu299").hcas[1].address == IP("10.100.3.44")  # 10.100.2.0 + 300
    # 2 GPUs per rail and host (GPU g: rail g % 4, rank g // 4): 600 endpoints + network and
    # broadcast per rail -> a /22 each; GPU 7 of host 299 is rail 3's (299 * 2 + 1 + 1)-th.
    assert {r: str(n) for r, n in f.endpoint_subnets.items()} == {
        0: "10.200.0.0/22",
        1: "10.200.4.0/22",
        2: "10.200.8.0/22",
        3: "10.200.12.0/22",
    }
    assert f.host("gpu299").endpoints[7] == IP("10.200.14.88")  # 10.200.12.0 + 600
    assert f.host("gpu000").endpoints == [
        IP(a) for a in ("10.200.0.1", "10.200.4.1", "10.200.8.1", "10.200.12.1")
    ] + [IP(a) for a in ("10.200.0.2", "10.200.4.2", "10.200.8.2", "10.200.12.2")]
    # GPUs beyond the rails: home rail g % 4, NUMA split over the 8 GPUs.
    assert f.host("gpu000").gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("hosts", [1, 300, 2048])
def test_generated_fabrics_pass_the_stricter_checks_and_can_be_served(hosts: int) -> None:
    """Distinct netdevs per host, one cable per HCA port, no self-loop, disjoint subnets (all
    checked by Fabric), and a netdev and endpoints everywhere: the service serves it."""
    from linkguard.topology.fabric import serving_problems

    f = generate_rail_optimized(hosts=hosts, rails=8)
    assert serving_problems(f) == []
    assert [c.netdev for c in f.hosts[-1].hcas] == [f"rail{r}" for r in range(8)]
    nets = [*f.rail_subnets.values(), *f.endpoint_subnets.values()]
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :])
    assert len(nets) == 16


def test_generator_refuses_too_small_prefix() -> None:
    with pytest.raises(ValueError, match="too small"):
        generate_rail_optimized(hosts=300, rail_prefix="10.100.0.0/21")
    with pytest.raises(ValueError, match="too small"):
        generate_rail_optimized(hosts=40, endpoint_prefix="10.200.0.0/24")
    # one /24 per rail holds 254 hosts' endpoints: 8 of them fill a /21; 255 hosts need a /23
    # per rail
    assert len(generate_rail_optimized(hosts=254, endpoint_prefix="10.200.0.0/21").hosts) == 254
    with pytest.raises(ValueError, match=r"8 rails x 512 addresses for 255 hosts"):
        generate_rail_optimized(hosts=255, endpoint_prefix="10.200.0.0/21")


def test_16384_hosts_get_widened_default_prefixes_and_validate() -> None:
    """131,072 GPUs (16,384 hosts x 8 rails, 512 SUs with a core tier): the default /16s are
    too small (8 x 32,768 addresses), so the defaults widen to the /14s around them; every
    address is a host address of its rail's /17 (checked by Fabric) and the service serves it."""
    from linkguard.topology.fabric import serving_problems

    f = generate_rail_optimized(hosts=16384, rails=8)
    assert len(f.hosts) == 16384 and len(names(f, "leaf")) == 512 * 8
    assert serving_problems(f) == []
    assert {r: str(n) for r, n in f.rail_subnets.items()} == {
        r: f"10.{100 + r // 2}.{128 * (r % 2)}.0/17" for r in range(8)
    }
    assert {r: str(n) for r, n in f.endpoint_subnets.items()} == {
        r: f"10.{200 + r // 2}.{128 * (r % 2)}.0/17" for r in range(8)
    }
    last = f.host("gpu16383")
    assert last.hcas[0].address == IP("10.100.64.0")  # 10.100.0.0 + 16,384
    assert last.hcas[7].address == IP("10.103.192.0")
    assert last.endpoints[0] == IP("10.200.64.0") and last.endpoints[7] == IP("10.203.192.0")
    assert f.host("gpu000").hcas[1].address == IP("10.100.128.1")
    whole = [ipaddress.IPv4Network("10.100.0.0/14"), ipaddress.IPv4Network("10.200.0.0/14")]
    assert all(n.subnet_of(whole[0]) for n in f.rail_subnets.values())
    assert all(n.subnet_of(whole[1]) for n in f.endpoint_subnets.values())


def test_default_prefixes_stay_the_16s_while_they_fit() -> None:
    """8,190 hosts on 8 rails is the most a /16 holds (8 x 8,192): same addresses as before
    (2,048 hosts: a /20 per rail)."""
    assert default_prefix("10.100.0.0/16", 8 * 8192) == ipaddress.IPv4Network("10.100.0.0/16")
    assert default_prefix("10.100.0.0/16", 8 * 8192 + 1) == ipaddress.IPv4Network("10.100.0.0/15")
    assert default_prefix("10.100.0.0/16", 8 * 65536) == ipaddress.IPv4Network("10.96.0.0/13")
    assert default_prefix("10.200.0.0/16", 8 * 65536) == ipaddress.IPv4Network("10.200.0.0/13")
    f = generate_rail_optimized(hosts=2048, rails=8)
    assert {r: str(n) for r, n in f.rail_subnets.items()} == {
        r: f"10.100.{16 * r}.0/20" for r in range(8)
    }
    assert {r: str(n) for r, n in f.endpoint_subnets.items()} == {
        r: f"10.200.{16 * r}.0/20" for r in range(8)
    }
    assert f.host("gpu2047").hcas[7].address == IP("10.100.120.0")  # 10.100.112.0 + 2,048


def test_too_small_user_prefix_names_the_length_needed() -> None:
    """A prefix that is given is used as is: too small is an error with the length needed and
    an example, never a silent widening."""
    msg = (
        "rail prefix 10.100.0.0/16 too small: 8 rails x 32768 addresses for 16384 hosts: "
        "needs a /14 or wider (8 x /17), e.g. 10.100.0.0/14"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        generate_rail_optimized(hosts=16384, rail_prefix="10.100.0.0/16")
    with pytest.raises(
        ValueError, match=re.escape("needs a /14 or wider (8 x /17), e.g. 10.200.0.0/14")
    ):
        generate_rail_optimized(hosts=16384, endpoint_prefix="10.200.0.0/16")
    # 6 rails of /23 (300 hosts): 6 x 512 = 3,072 addresses -> a /20
    with pytest.raises(
        ValueError, match=re.escape("needs a /20 or wider (6 x /23), e.g. 10.7.0.0/20")
    ):
        generate_rail_optimized(hosts=300, rails=6, rail_prefix="10.7.1.0/24")


@pytest.mark.parametrize(
    ("hosts", "spines", "pairs", "per_pair"),
    [(64, 8, 16 * 8, 4), (128, 16, 32 * 16, 2)],  # H100 RA Table 4: 512 and 1,024 cables
    ids=["2-SU", "4-SU"],
)
def test_two_tiers_every_leaf_reaches_every_spine(hosts, spines, pairs, per_pair) -> None:
    f = generate_rail_optimized(hosts=hosts)
    shape = rail_optimized_shape(hosts=hosts)
    assert not shape.core and shape.cores == 0
    assert len(names(f, "spine")) == spines
    per = cables(f, "leaf-spine")
    assert len(per) == pairs and set(per.values()) == {per_pair}
    assert sum(per.values()) == hosts * 8
    assert "spine-spine" not in {link.kind for link in f.links}
    # hosts 32..63 are SU 1
    assert next(link.b for link in f.links if link.a == "gpu032:mlx5_5/1") == "su1-leaf5"


@pytest.fixture(scope="module")
def su16() -> Fabric:
    return generate_rail_optimized(hosts=512)


def test_sixteen_sus_get_the_core_tier(su16: Fabric) -> None:
    leaves = names(su16, "leaf")
    spines = [s.name for s in su16.switches if s.role == "spine" and s.su is not None]
    cores = [s.name for s in su16.switches if s.role == "spine" and s.su is None]
    # B200 RA, 16 SUs: 128 leaves, 64 core switches, 4,096 leaf-spine and spine-core cables
    assert (len(leaves), len(spines), len(cores)) == (128, 64, 64)
    assert cores[:2] == ["cg0-core0", "cg0-core1"] and cores[-1] == "cg3-core15"
    kinds = Counter(link.kind for link in su16.links)
    assert kinds == {"host-leaf": 4096, "leaf-spine": 4096, "spine-spine": 4096}
    # leaves reach only their own SU's spines, 8 cables each: linear, not leaves x spines
    up = cables(su16, "leaf-spine")
    assert len(up) == 128 * 4 and set(up.values()) == {8}
    assert all(a.split("-")[0] == b.split("-")[0] for a, b in up)
    # spine k of every SU: 64 cables down, 64 up, 4 to each of the 16 cores of group k
    core_pairs = cables(su16, "spine-spine")
    assert len(core_pairs) == 64 * 16 and set(core_pairs.values()) == {4}
    # spine k ("su3-spine2") cables only to core group k ("cg2-core7")
    assert all(a.split("spine")[1] == b.split("-")[0].removeprefix("cg") for a, b in core_pairs)
    ports = Counter()
    for (a, b), n in core_pairs.items():
        ports[a] += n
        ports[b] += n
    assert {ports[s] for s in spines} == {64} and {ports[c] for c in cores} == {64}


def test_sixty_four_sus_fleet_scale() -> None:
    f = generate_rail_optimized(hosts=2048)
    shape = rail_optimized_shape(hosts=2048)
    assert (shape.sus, shape.leaves, shape.spines, shape.cores) == (64, 512, 256, 256)
    kinds = Counter(link.kind for link in f.links)
    assert kinds == {"host-leaf": 16384, "leaf-spine": 16384, "spine-spine": 16384}  # B200 RA
    core_pairs = cables(f, "spine-spine")
    assert len(core_pairs) == 256 * 64 and set(core_pairs.values()) == {1}
    # address layout at fleet scale: a /20 per rail, for the rail addresses and the endpoints
    last = f.host("gpu2047")
    assert last.hcas[7].address == IP("10.100.120.0")  # 10.100.112.0 + 2048
    assert f.endpoint_subnets[7] == ipaddress.IPv4Network("10.200.112.0/20")
    assert last.endpoints[0] == IP("10.200.8.0")  # 10.200.0.0 + 2048
    assert last.endpoints[7] == IP("10.200.120.0")  # 10.200.112.0 + 2048
    assert next(link.b for link in f.links if link.a == "gpu2047:mlx5_7/1") == "su63-leaf7"


@pytest.mark.parametrize(
    ("kwargs", "core"),
    [
        ({"hosts": 256}, False),  # 8 SUs x 4 spines = 32 = a leaf's uplinks: two tiers
        ({"hosts": 288}, True),  # 9 SUs: 36 spines, a leaf cannot reach them all
        ({"hosts": 480, "spines_per_su": 1}, False),  # 15 SUs
        ({"hosts": 512, "spines_per_su": 1}, True),  # from 16 SUs on
        ({"hosts": 32, "core": True}, True),
    ],
)
def test_core_tier_auto(kwargs, core) -> None:
    assert rail_optimized_shape(**kwargs).core is core
    f = generate_rail_optimized(**kwargs)
    assert ("spine-spine" in {link.kind for link in f.links}) is core


def test_forced_core_on_one_su() -> None:
    f = generate_rail_optimized(hosts=32, core=True)
    cores = [s.name for s in f.switches if s.su is None]
    assert cores == ["cg0-core0", "cg1-core0", "cg2-core0", "cg3-core0"]
    assert cables(f, "spine-spine") == {(f"su0-spine{k}", f"cg{k}-core0"): 64 for k in range(4)}


def test_uneven_uplinks_spread_within_one_cable() -> None:
    f = generate_rail_optimized(hosts=20, rails=3, hosts_per_su=10)  # 10 uplinks over 8 spines
    per = cables(f, "leaf-spine")
    for leaf in names(f, "leaf"):
        counts = [per[(leaf, sp)] for sp in names(f, "spine")]
        assert sum(counts) == 10 and max(counts) - min(counts) <= 1, (leaf, counts)
    totals = Counter()
    for (_, spine), n in per.items():
        totals[spine] += n
    assert max(totals.values()) - min(totals.values()) <= 1 and sum(totals.values()) == 60


def test_management_slots() -> None:
    f = generate_rail_optimized(hosts=62, management_hosts_per_su=1)
    plain = generate_rail_optimized(hosts=62)
    shape = rail_optimized_shape(hosts=62, management_hosts_per_su=1)
    assert (shape.sus, shape.compute_hosts_per_su) == (2, 31)
    # host 31 moves to SU 1; names and addresses do not depend on the reserved slots
    assert next(link.b for link in f.links if link.a == "gpu031:mlx5_2/1") == "su1-leaf2"
    assert f.hosts == plain.hosts
    on_leaf = Counter(link.b for link in f.links if link.kind == "host-leaf")
    assert set(on_leaf.values()) == {31}
    # leaves stay cabled for the full SU of 32 slots (RA: build the fabric for full SUs)
    assert Counter(link.a for link in f.links if link.kind == "leaf-spine") == {
        leaf: 32 for leaf in names(f, "leaf")
    }
    # 4 x 31 = 124 hosts still fit 4 SUs; one more needs a fifth
    assert rail_optimized_shape(hosts=124, management_hosts_per_su=1).sus == 4
    assert rail_optimized_shape(hosts=125, management_hosts_per_su=1).sus == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"management_hosts_per_su": 32}, "below hosts_per_su"),
        ({"spines_per_su": 0, "core": True}, "needs spines"),
        ({"hosts": 300, "core": False}, "two tiers cannot be cabled"),
        ({"hosts": 0}, ">= 1"),
        ({"gpus_per_host": 65}, "64 GPUs"),
        (
            {"hosts": 64, "spines_per_su": 0},
            r"64 hosts need 2 SUs of 32, and SUs without spines cannot reach each other",
        ),
        ({"hosts": 32, "spines_per_su": 0, "management_hosts_per_su": 1}, "2 SUs of 31"),
    ],
)
def test_bad_parameters(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        generate_rail_optimized(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hosts": 31},
        {"hosts": 100, "rails": 4, "hosts_per_su": 16, "spines_per_su": 2},
        {"hosts": 512, "spines_per_su": 8},
        {"hosts": 30, "spines_per_su": 0},
        {"hosts": 40, "hosts_per_su": 64, "spines_per_su": 0, "rails": 2},
    ],
)
def test_shape_matches_the_fabric(kwargs) -> None:
    s = rail_optimized_shape(**kwargs)
    f = generate_rail_optimized(**kwargs)
    kinds = Counter(link.kind for link in f.links)
    assert kinds["host-leaf"] == s.host_leaf_cables
    assert kinds["leaf-spine"] == s.leaf_spine_cables
    assert kinds["spine-spine"] == s.spine_core_cables
    assert len(f.switches) == s.leaves + s.spines + s.cores


def test_one_su_without_spines_is_leaves_only() -> None:
    f = generate_rail_optimized(hosts=32, spines_per_su=0)
    assert [s.name for s in f.switches] == [f"su0-leaf{r}" for r in range(8)]
    assert {link.kind for link in f.links} == {"host-leaf"} and len(f.links) == 256
    # each rail's leaf holds every host: any two hosts still meet on every rail
    assert set(Counter(link.b for link in f.links).values()) == {32}


def test_b200_spine_count_gives_the_same_cores() -> None:
    s = rail_optimized_shape(hosts=512, spines_per_su=8)  # B200 RA: 128 spines at 16 SUs
    assert (s.spines, s.cores, s.spine_uplinks, s.spine_core_cables) == (128, 64, 32, 4096)


def test_import_paths_and_no_cycle() -> None:
    assert via_fabric is generate_rail_optimized
    for first in ("linkguard.topology.generator", "linkguard.topology.fabric"):
        code = (
            f"import {first}\n"
            "from linkguard.topology.fabric import generate_rail_optimized as g\n"
            "print(len(g(hosts=2, rails=2).hosts))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert (out.returncode, out.stdout.strip()) == (0, "2"), out.stderr
