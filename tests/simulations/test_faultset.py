"""The switch-level faults in force while a scenario plays (linkguard.simulations.faultset):
the set each switch and cable event leaves, as the bus carries it."""

from __future__ import annotations

import json

from linkguard.models import CableRef, FabricFaults, decode, encode
from linkguard.simulations.faultset import SWITCH_KINDS, FaultSet
from linkguard.simulations.scenario import EVENT_KINDS, Event
from linkguard.simulations.scenario_schema import EventKind


def switch(kind: EventKind, name: str) -> Event:
    return Event(at_s=1.0, kind=kind, entry=0, switch=name)


def cables(kind: EventKind, a: str, b: str, count: int | None = None) -> Event:
    return Event(at_s=1.0, kind=kind, entry=0, cable=CableRef(a=a, b=b, count=count))


def test_the_switch_kinds_are_the_scenario_event_kinds_of_switches_and_cables() -> None:
    assert {k for k in EVENT_KINDS if k.startswith(("switch_", "cables_"))} == SWITCH_KINDS
    assert {"switch_down", "switch_up", "cables_down", "cables_up"} == SWITCH_KINDS


def test_events_build_the_set_in_force() -> None:
    fs = FaultSet()
    assert not fs
    assert fs.faults(at=5.0) == FabricFaults(switches_down=[], cables_down=[], at=5.0)
    assert fs.apply(switch("switch_down", "su0-leaf2"))
    assert fs.apply(switch("switch_down", "su0-leaf0"))
    assert fs.apply(cables("cables_down", "su1-spine0", "su0-leaf3"))
    assert fs.apply(cables("cables_down", "su0-leaf1", "su0-spine0", count=2))
    assert fs
    assert fs.switches == {"su0-leaf0", "su0-leaf2"}
    # in the order the pairs went down, each as its event named it
    assert fs.cables == (
        CableRef(a="su1-spine0", b="su0-leaf3"),
        CableRef(a="su0-leaf1", b="su0-spine0", count=2),
    )
    got = fs.faults(at=7.5, reason="sim lab x")
    assert json.loads(encode(got)) == {
        "switches_down": ["su0-leaf0", "su0-leaf2"],
        "cables_down": [
            {"a": "su1-spine0", "b": "su0-leaf3", "count": None},
            {"a": "su0-leaf1", "b": "su0-spine0", "count": 2},
        ],
        "reason": "sim lab x",
        "at": 7.5,
    }
    assert decode(FabricFaults, encode(got)) == got
    # sorted by pair: (su0-leaf1, su0-spine0) before (su0-leaf3, su1-spine0)
    assert [c.pair for c in fs.faults(at=7.5, sort_cables=True).cables_down] == [
        ("su0-leaf1", "su0-spine0"),
        ("su0-leaf3", "su1-spine0"),
    ]


def test_a_cut_of_the_same_pair_replaces_the_earlier_one_and_ups_restore() -> None:
    fs = FaultSet()
    fs.apply(cables("cables_down", "su0-leaf1", "su0-spine0", count=1))
    fs.apply(cables("cables_down", "su0-spine0", "su0-leaf1", count=3))  # same pair, other order
    assert fs.cables == (CableRef(a="su0-spine0", b="su0-leaf1", count=3),)
    fs.apply(switch("switch_down", "su0-leaf2"))
    assert fs.apply(cables("cables_up", "su0-leaf1", "su0-spine0"))
    assert fs.cables == ()
    assert fs.apply(switch("switch_up", "su0-leaf2"))
    assert fs.switches == frozenset()
    assert not fs
    # an up of something not down changes nothing
    assert fs.apply(switch("switch_up", "su0-leaf9"))
    assert fs.apply(cables("cables_up", "su0-leaf9", "su0-spine0"))
    assert not fs


def test_other_events_are_not_switch_faults() -> None:
    fs = FaultSet()
    fs.apply(switch("switch_down", "su0-leaf2"))
    for kind in sorted(set(EVENT_KINDS) - SWITCH_KINDS):
        e = Event(at_s=2.0, kind=kind, entry=1, host="gpu001", rail=1)
        assert fs.apply(e) is False
    assert fs.switches == {"su0-leaf2"}
    assert fs.cables == ()
