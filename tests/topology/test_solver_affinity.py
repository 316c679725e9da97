"""The solver's choice of alternates by host layout: an HCA on the GPU's (or failed HCA's) PCIe
switch first, then one on its NUMA node, then any; the generator's default layout; the fabric's
checks of switch data; and the whole path from a real NCCL topology file to a rail assignment."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from linkguard.layout import annotate_inventory, load_nccl_topo
from linkguard.models import HostInventory
from linkguard.topology.fabric import Fabric, dump_fabric, home_rails, load_fabric
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.solver import Solver, egress, solve

# rails 0..4 of every host: PCIe switch and NUMA node of each HCA. Rail 0's switch also holds
# rails 3 and 4; rail 2 is NUMA-local to it on another switch; rail 1 is on the other socket.
SWITCH = {0: "sw0", 1: "sw1", 2: "sw2", 3: "sw0", 4: "sw0"}
NUMA = {0: 0, 1: 1, 2: 0, 3: 0, 4: 0}


def _with_layout(fabric: Fabric, switch=SWITCH, numa=NUMA, *, gpu_switches: bool = True) -> Fabric:
    """``fabric`` with every host's HCAs on ``switch``/``numa`` (by rail) and each GPU on its
    home HCA's switch and node (``gpu_switches=False``: GPU switches left to the solver's
    fallback, the home HCA's)."""
    hosts = []
    for h in fabric.hosts:
        home = home_rails(h)
        d = h.model_dump()
        for c in d["hcas"]:
            c["pcie_switch"], c["numa_node"] = switch.get(c["rail"]), numa.get(c["rail"])
        d["gpu_numa"] = [numa.get(r) for r in home]
        d["gpu_pcie_switch"] = [switch.get(r) for r in home] if gpu_switches else []
        hosts.append(HostInventory.model_validate(d))
    return Fabric.model_validate({**fabric.__dict__, "hosts": hosts})


def _base(explicit: bool = False, **kw) -> Fabric:
    f = generate_rail_optimized(hosts=4, rails=5, numa_split=False, **kw)
    if explicit:
        f = Fabric.model_validate({**f.__dict__, "endpoint_subnets": {}})
    return f


def _assigned(fabric: Fabric, host: str, down: set[int]) -> dict[int, int]:
    plan = solve(fabric, {host: frozenset(down)}, epoch=1, now=0.0)[host]
    return {a.gpu: a.rail for a in plan.rail_assignments}


@pytest.mark.parametrize("gpu_switches", [True, False])
def test_gpu_moves_to_its_switch_then_its_numa_node_then_any(gpu_switches: bool) -> None:
    """GPU 0 (home rail 0 on sw0, NUMA 0) as its HCAs go down one after another."""
    f = _with_layout(_base(), gpu_switches=gpu_switches)
    assert _assigned(f, "gpu000", {0})[0] == 3  # the lowest HCA on its switch
    assert _assigned(f, "gpu000", {0, 3})[0] == 4  # the other one on its switch
    assert _assigned(f, "gpu000", {0, 3, 4})[0] == 2  # NUMA-local, before the lower rail 1
    assert _assigned(f, "gpu000", {0, 2, 3, 4})[0] == 1  # any
    # without a layout the old order: NUMA node (all 0 here), load, lowest rail
    assert _assigned(_base(), "gpu000", {0})[0] == 1
    # a GPU whose own switch is down entirely: GPU 1 (rail 1, sw1, NUMA 1) -> any, lowest rail
    assert _assigned(f, "gpu000", {1})[1] == 0


def test_switch_local_hca_before_an_idle_numa_local_one() -> None:
    """Switch first even when the switch-local HCAs already carry moved GPUs: with 15 GPUs on
    5 rails, GPUs 0, 5 and 10 are homed on rail 0; they go to rails 3, 4 (sw0, load spread
    within the switch), then 3 again, never to the idle NUMA-local rail 2."""
    f = _with_layout(_base(gpus_per_host=15))
    got = _assigned(f, "gpu001", {0})
    assert (got[0], got[5], got[10]) == (3, 4, 3)
    # without switch ids the NUMA-local HCAs share them by load: 2, 3, 4
    got = _assigned(_with_layout(_base(gpus_per_host=15), switch={}), "gpu001", {0})
    assert (got[0], got[5], got[10]) == (2, 3, 4)


@pytest.mark.parametrize("explicit", [False, True])
def test_routes_to_a_lost_rail_take_its_switch_neighbours_first(explicit: bool) -> None:
    """gpu000 loses rail 0: the routes to its GPU 0 are dealt over the survivors in the order
    switch (3, 4), NUMA node (2), any (1): the next host takes S[0], the one after S[1], ..."""
    f = _with_layout(_base(explicit))
    plans = solve(f, {"gpu000": frozenset({0})}, epoch=1, now=0.0)
    ep = f.host("gpu000").endpoints[0]
    assert [egress(plans[h], ep) for h in ("gpu001", "gpu002", "gpu003")] == [(3,), (4,), (2,)]
    # NUMA only (no switch ids): NUMA-local by rail, then the rest
    f = _with_layout(_base(explicit), switch={})
    plans = solve(f, {"gpu000": frozenset({0})}, epoch=1, now=0.0)
    assert [egress(plans[h], ep) for h in ("gpu001", "gpu002", "gpu003")] == [(2,), (3,), (4,)]


def test_incremental_with_layouts_equals_full_build() -> None:
    """Hosts of three layouts (switches, NUMA only, none) in one fabric, a history of
    failures: the incremental plans equal a full build after each batch."""
    f = _with_layout(_base())
    plain = _base()
    numa_only = _with_layout(_base(), switch={})
    hosts = [f.hosts[0], numa_only.hosts[1], plain.hosts[2], f.hosts[3]]
    mixed = Fabric.model_validate({**f.__dict__, "hosts": hosts})
    solver = Solver(mixed, {})
    history = [
        {"gpu000": {0}},
        {"gpu000": {0, 3}, "gpu002": {0}},
        {"gpu001": {0, 2}, "gpu003": {4}},
        {"gpu000": set(), "gpu001": set(), "gpu002": set(), "gpu003": set()},
    ]
    for batch in history:
        solver.update(batch)
        full = Solver(mixed, {h: solver.unusable_of(h) for h in mixed.host_names})
        assert solver.plans(epoch=1, now=0.0) == full.plans(epoch=1, now=0.0)


def test_generator_default_layout() -> None:
    f = generate_rail_optimized(hosts=2, rails=8, rails_per_pcie_switch=2)
    h = f.host("gpu001")
    assert [c.pcie_switch for c in h.hcas] == [f"pcie{r // 2}" for r in range(8)]
    assert h.gpu_pcie_switch == [f"pcie{g // 2}" for g in range(8)]
    assert h.gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]
    # 16 GPUs on 8 rails: GPU g sits on its home rail's switch and node
    h = generate_rail_optimized(hosts=1, rails=8, gpus_per_host=16, rails_per_pcie_switch=4)
    assert h.hosts[0].gpu_pcie_switch == [f"pcie{(g % 8) // 4}" for g in range(16)]
    assert h.hosts[0].gpu_numa == [(g % 8) // 4 for g in range(16)]
    # the default: no switch ids, and fabric files without the key
    plain = generate_rail_optimized(hosts=2, rails=2)
    assert all(c.pcie_switch is None for c in plain.hosts[0].hcas)
    assert "pcie_switch" not in dump_fabric(plain) and "gpu_pcie_switch" not in dump_fabric(plain)
    with pytest.raises(
        ValueError, match=r"puts rails 3 and 4 \(NUMA nodes 0 and 1\) on one PCIe switch"
    ):
        generate_rail_optimized(hosts=1, rails=8, rails_per_pcie_switch=3)
    with pytest.raises(ValueError, match="rails_per_pcie_switch must be >= 0"):
        generate_rail_optimized(hosts=1, rails=8, rails_per_pcie_switch=-1)
    # one switch for all rails is fine on one NUMA node
    one = generate_rail_optimized(hosts=1, rails=4, numa_split=False, rails_per_pcie_switch=4)
    assert {c.pcie_switch for c in one.hosts[0].hcas} == {"pcie0"}


def test_fabric_file_round_trip_keeps_the_layout(tmp_path: Path) -> None:
    f = generate_rail_optimized(hosts=2, rails=4, rails_per_pcie_switch=2)
    for fmt in ("json", "yaml"):
        p = tmp_path / f"f.{fmt}"
        p.write_text(dump_fabric(f, fmt))
        assert load_fabric(p) == f


def test_fabric_refuses_inconsistent_switch_data() -> None:
    f = generate_rail_optimized(hosts=1, rails=4, rails_per_pcie_switch=2)
    d = f.hosts[0].model_dump(mode="json")
    d["hcas"][2]["pcie_switch"] = "pcie0"  # rail 2 is NUMA 1, pcie0 holds NUMA 0 devices
    with pytest.raises(
        ValidationError, match="PCIe switch 'pcie0' has HCA mlx5_0/1 on NUMA node 0"
    ):
        Fabric.model_validate({**f.__dict__, "hosts": [d]})
    d = f.hosts[0].model_dump(mode="json")
    d["gpu_pcie_switch"] = ["pcie0"]
    with pytest.raises(ValidationError, match="gpu_pcie_switch has 1 entries for 4 endpoints"):
        Fabric.model_validate({**f.__dict__, "hosts": [d]})
    d["gpu_pcie_switch"] = ["bad id!", None, None, None]
    with pytest.raises(ValidationError, match="gpu_pcie_switch"):
        Fabric.model_validate({**f.__dict__, "hosts": [d]})


def test_p5_layout_from_its_nccl_file_steers_the_rail_assignment(
    fixtures_real: Path, tmp_path: Path
) -> None:
    """Two p5-like hosts with the 32 EFA NICs of aws-ofi-nccl's p5 file as rails 0-31 and 8
    GPUs (GPU g homed on rail g by the g % n rule): annotated from the file, GPU 4 (on the switch
    of rails 16-19) moves to rail 16 when rail 4 goes; without the layout, to rail 0."""
    xml = tmp_path / "p5.xml"
    shutil.copyfile(fixtures_real / "aws-ofi-nccl/p5.48xl-topo.xml", xml)
    layout = load_nccl_topo(xml)
    plain = generate_rail_optimized(hosts=2, rails=32, gpus_per_host=8, numa_split=False)
    hosts = []
    for h in plain.hosts:
        d = h.model_dump()
        for c in d["hcas"]:
            c["pci_address"] = layout.nics[c["rail"]].bdf
        hosts.append(annotate_inventory(HostInventory.model_validate(d), layout))
    f = Fabric.model_validate({**plain.__dict__, "hosts": hosts})
    assert f.hosts[0].gpu_pcie_switch[4] == "0000:04:00.0"
    assert _assigned(f, "gpu000", {4})[4] == 16
    assert _assigned(f, "gpu000", {0})[0] == 1  # GPU 0's own switch: rails 0-3
    assert _assigned(plain, "gpu000", {4})[4] == 0
