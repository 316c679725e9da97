"""Switch-level faults: leaves down or cut off, uplink capacity and bisection, and what they do
to plans through the service's state."""

from __future__ import annotations

import pytest

from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.health import SwitchModel, assess
from linkguard.topology.solver import egress
from linkguard.topology.state import FabricState

# 64 hosts = 2 SUs of 32, 4 rails, 4 spines per SU, no core tier: every leaf has uplinks to
# the 8 spines of both SUs (2 x 400 Gb/s... see counts below)
FABRIC = generate_rail_optimized(hosts=64, rails=4)


def _uplinks(leaf: str) -> list[int]:
    return [
        i
        for i, link in enumerate(FABRIC.links)
        if link.kind == "leaf-spine" and leaf in (link.a, link.b)
    ]


def test_nothing_down() -> None:
    h = assess(FABRIC)
    assert h.unusable == {}
    assert h.bisection_gbps == h.nominal_bisection_gbps > 0
    assert not any(x.cut_off or x.down for x in h.leaves)
    leaf = next(x for x in h.leaves if x.leaf == "su1-leaf2")
    assert leaf.up_gbps == leaf.nominal_gbps == len(_uplinks("su1-leaf2")) * 400.0


def test_leaf_down_takes_its_rail_from_its_hosts() -> None:
    h = assess(FABRIC, switches_down=["su1-leaf2"])
    assert h.unusable == {f"gpu{i:03d}": frozenset({2}) for i in range(32, 64)}
    assert h.summary()["leaves_down"] == ["su1-leaf2"]


def test_some_uplinks_down_shrink_capacity_but_move_nothing() -> None:
    ups = _uplinks("su0-leaf1")
    h = assess(FABRIC, links_down=ups[:3])
    assert h.unusable == {}
    leaf = next(x for x in h.leaves if x.leaf == "su0-leaf1")
    assert (leaf.up_gbps, leaf.cut_off) == ((len(ups) - 3) * 400.0, False)
    assert h.bisection_gbps == h.nominal_bisection_gbps - 3 * 400.0 / 2
    assert h.summary()["leaves_uplinks_reduced"] == {
        "su0-leaf1": round((len(ups) - 3) / len(ups), 3)
    }


def test_all_uplinks_down_cuts_the_leaf_off_its_rail() -> None:
    h = assess(FABRIC, links_down=_uplinks("su0-leaf1"))
    # the 32 hosts of SU 0 lose rail 1: one rail-1 leaf on each side of the cut, and the tie
    # goes to the side with the spines (by name alone su0-leaf1 would have won)
    assert h.unusable == {f"gpu{i:03d}": frozenset({1}) for i in range(32)}
    assert h.summary()["leaves_cut_off"] == ["su0-leaf1"]


def test_spine_down_reports_bisection_only() -> None:
    spine = "su0-spine0"
    model = SwitchModel(FABRIC)
    h = model.assess(switches_down=[spine])
    lost = sum(
        (link.rate_gbps or 0)
        for link in FABRIC.links
        if link.kind == "leaf-spine" and spine in (link.a, link.b)
    )
    assert lost > 0
    assert h.unusable == {}
    assert h.bisection_gbps == h.nominal_bisection_gbps - lost / 2


def test_bad_fault_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown switch 'nope'"):
        assess(FABRIC, switches_down=["nope"])
    with pytest.raises(ValueError, match="link index 99999 out of range"):
        assess(FABRIC, links_down=[99999])


def test_state_turns_a_cut_off_leaf_into_plans_and_back() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    s.solve(0.0)
    ep = FABRIC.host("gpu005").endpoints[1]  # GPU 1: home rail 1, behind su0-leaf1
    assert egress(s.plans["gpu040"], ep) == (1,)
    s.on_switch_faults(links_down=_uplinks("su0-leaf1"))
    assert s.dirty
    solved = s.solve(1.0)
    assert len(solved.plans) == 64  # every host: SU 0's lost a rail, the others route around
    out = egress(s.plans["gpu040"], ep)
    assert out and 1 not in out
    s.on_switch_faults()  # repaired
    s.solve(2.0)
    assert egress(s.plans["gpu040"], ep) == (1,)
    with pytest.raises(ValueError):
        s.on_switch_faults(switches_down=["nope"])
    assert s.health is not None and s.health.unusable == {}
