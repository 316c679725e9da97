"""The pure parts of a lab replay's steps and fault injection (linkguard.simulations.labsteps,
.labinject): steps by instant, what comes back when, which ports a step takes down. No lab is
built: the injector's model answers from the fabric alone."""

from __future__ import annotations

from pathlib import Path

from linkguard.simulations.labinject import FaultInjector, LabRig
from linkguard.simulations.labprocs import Procs
from linkguard.simulations.labsteps import res_key, return_at, steps_of
from linkguard.simulations.scenario import SCENARIOS_DIR, expand, load_scenario


def golden(name: str):
    return load_scenario(SCENARIOS_DIR / f"{name}.yaml")


def injector(loaded, tmp_path: Path) -> FaultInjector:
    rig = LabRig(procs=Procs(tmp_path), linkguard=True)
    return FaultInjector(loaded.fabric, rig, reason="test")


def test_a_leaf_reboot_is_two_steps_and_takes_down_its_four_hosts_rail(tmp_path: Path) -> None:
    loaded = golden("leaf-reboot")
    events = expand(loaded)
    steps = steps_of(events)
    assert [(s.at_s, s.is_down, s.resources) for s in steps] == [
        (2.0, True, {"switch", "port"}),  # the leaf and its hosts' ports on it
        (7.0, False, {"switch", "port"}),
    ]
    assert steps[0].what(loaded) == "leaf_reboot su0-leaf2 down"
    assert res_key(steps[0].events[0]) == ("switch", "su0-leaf2")
    assert return_at(steps[0], steps) == 7.0
    assert return_at(steps[1], steps) is None
    inject = injector(loaded, tmp_path)
    down = {(f"gpu00{i}", 2) for i in range(4)}
    assert inject.targets(events) == down
    assert inject.step_targets(events, steps[0]) == down
    assert inject.step_targets(events, steps[1]) == set()  # an up takes nothing down
    assert inject.truth() == {}  # nothing applied yet


def test_a_link_down_targets_its_port_and_comes_back_with_its_link_up(tmp_path: Path) -> None:
    loaded = golden("single-link-down")
    events = expand(loaded)
    steps = steps_of(events)
    assert [s.at_s for s in steps] == [2.0, 8.0]
    assert steps[0].what(loaded) == "link_down gpu001 rail 1"
    assert res_key(steps[0].events[0]) == ("port", "gpu001", 1)
    assert return_at(steps[0], steps) == 8.0
    inject = injector(loaded, tmp_path)
    assert inject.targets(events) == {("gpu001", 1)}
    assert inject.step_targets(events, steps[0]) == {("gpu001", 1)}


def test_cables_cut_target_the_ports_behind_a_leaf_cut_off_only(tmp_path: Path) -> None:
    """uplink-loss: one of su0-leaf1's cables to a spine (it keeps others) takes nothing down;
    all four of su1-leaf3's uplinks cut take rail 3 of SU 1's eight hosts (gpu008-gpu015)."""
    loaded = golden("uplink-loss")
    events = expand(loaded)
    steps = steps_of(events)
    assert [s.at_s for s in steps] == [2.0, 8.0, 10.0, 15.0]
    assert steps[2].what(loaded) == (
        "uplink_loss down: su1-leaf3/su0-spine0, su1-leaf3/su0-spine1, su1-leaf3/su1-spine0, "
        "su1-leaf3/su1-spine1"
    )
    assert [return_at(s, steps) for s in steps] == [8.0, None, 15.0, None]
    inject = injector(loaded, tmp_path)
    su1_rail3 = {(f"gpu{i:03d}", 3) for i in range(8, 16)}
    assert inject.targets(events) == su1_rail3
    assert [inject.step_targets(events, s) for s in steps] == [set(), set(), su1_rail3, set()]
