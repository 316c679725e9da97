"""Switch-level faults as the bus carries them (:class:`FabricFaults`): the contract, and how
the service's state resolves cables named by their two switches to the fabric's links."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from linkguard.models import CableRef, FabricFaults, decode, encode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.state import FabricState

# 64 hosts = 2 SUs of 32, 4 rails: 8 leaves, 8 spines, every leaf has 4 parallel cables to
# each of the 8 spines
FABRIC = generate_rail_optimized(hosts=64, rails=4)
SPINES = [s.name for s in FABRIC.switches if s.role == "spine"]


def _between(a: str, b: str) -> list[int]:
    return [i for i, link in enumerate(FABRIC.links) if {link.a, link.b} == {a, b}]


def _faults(*cables: CableRef, switches: tuple[str, ...] = ()) -> FabricFaults:
    return FabricFaults(switches_down=list(switches), cables_down=list(cables), at=1.0)


def test_contract_round_trips_and_refuses_nonsense() -> None:
    ff = FabricFaults(
        switches_down=["su1-spine2"],
        cables_down=[CableRef(a="su0-leaf1", b="su0-spine0", count=2)],
        reason="CHG-1234",
        at=1700000000.5,
    )
    assert decode(FabricFaults, encode(ff)) == ff
    assert CableRef(a="z", b="a").pair == CableRef(a="a", b="z").pair == ("a", "z")
    bad = [
        {"at": -1},
        {"at": 1, "surprise": 1},
        {"at": 1, "switches_down": ["gpu000:mlx5_0/1"]},  # a host port is no switch
        {"at": 1, "reason": "x" * 201},
        {"at": 1, "cables_down": [{"a": "s1", "b": "s1"}]},
        {"at": 1, "cables_down": [{"a": "s1", "b": "s2", "count": 0}]},
        {"at": 1, "cables_down": [{"a": "s1", "b": "s2"}, {"a": "s2", "b": "s1", "count": 1}]},
        {"at": 1, "switches_down": ["s"] * 4097},
    ]
    for doc in bad:
        with pytest.raises(ValidationError):
            FabricFaults.model_validate(doc)
    with pytest.raises(ValidationError, match="switch s1 listed twice"):
        FabricFaults(switches_down=["s1", "s2", " s1"], at=1)  # names are stripped


def test_cables_resolve_in_either_order_all_or_count() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    pair = _between("su0-leaf1", "su1-spine3")
    assert len(pair) == 4
    assert s.cable_indices([CableRef(a="su0-leaf1", b="su1-spine3")]) == pair
    assert s.cable_indices([CableRef(a="su1-spine3", b="su0-leaf1")]) == pair
    assert s.cable_indices([CableRef(a="su1-spine3", b="su0-leaf1", count=3)]) == pair[:3]
    two = [CableRef(a="su0-leaf1", b="su1-spine3", count=1), CableRef(a="su0-leaf0", b=SPINES[0])]
    assert s.cable_indices(two) == pair[:1] + _between("su0-leaf0", SPINES[0])


def test_all_uplinks_by_name_cut_the_leaf_off() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    health = s.on_fabric_faults(_faults(*(CableRef(a=sp, b="su1-leaf3") for sp in SPINES)))
    assert health.unusable == {f"gpu{i:03d}": frozenset({3}) for i in range(32, 64)}
    assert health.summary()["leaves_cut_off"] == ["su1-leaf3"]
    assert health.bisection_gbps == health.nominal_bisection_gbps - 32 * 400.0 / 2
    assert s.dirty and s.health is health
    # the same as naming the link indices
    links = [i for sp in SPINES for i in _between(sp, "su1-leaf3")]
    assert FabricState(fabric=FABRIC, epoch_start=1).on_switch_faults(links_down=links) == health


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        (_faults(CableRef(a="su0-leaf1", b="nope")), "cable su0-leaf1-nope: unknown switch 'nope'"),
        (_faults(CableRef(a="gpu000", b="su0-leaf0")), "unknown switch 'gpu000'"),  # a host
        (
            _faults(CableRef(a="su0-leaf0", b="su0-leaf1")),
            "cable su0-leaf0-su0-leaf1: no cable between these switches",
        ),
        (
            _faults(CableRef(a="su0-leaf0", b="su0-spine0", count=5)),
            "cable su0-leaf0-su0-spine0: 5 down but the fabric has only 4 between them",
        ),
        (_faults(switches=("su9-spine0",)), "unknown switch 'su9-spine0'"),
    ],
    ids=["unknown-switch", "host-not-switch", "no-cable", "count-too-large", "unknown-down"],
)
def test_impossible_faults_are_refused_and_change_nothing(
    faults: FabricFaults, message: str
) -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    s.solve(0.0)
    before = s.on_fabric_faults(_faults(switches=("su0-leaf2",)))
    s.solve(1.0)
    plans = dict(s.plans)
    # the impossible set also names a real fault: nothing of it may be applied
    with pytest.raises(ValueError, match=message):
        also = ["su0-leaf3", *faults.switches_down]
        s.on_fabric_faults(faults.model_copy(update={"switches_down": also}))
    with pytest.raises(ValueError, match=message):
        s.on_fabric_faults(faults)
    assert s.health is before and not s.dirty
    assert s.unusable() == {f"gpu{i:03d}": frozenset({2}) for i in range(32)}
    assert s.solve(2.0).plans == [] and s.plans == plans


def test_clearing_restores_nominal() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    s.solve(0.0)
    nominal = dict(s.plans)
    s.on_fabric_faults(_faults(switches=("su1-leaf0",)))
    assert len(s.solve(1.0).plans) == 64
    health = s.on_fabric_faults(_faults())
    assert health.unusable == {} and health.bisection_gbps == health.nominal_bisection_gbps
    s.solve(2.0)
    assert all(s.plans[h].same_assignments(p) for h, p in nominal.items())
