"""Scenario files: the golden scenarios, validation errors, round trips, expansion, the CLI."""

from __future__ import annotations

import copy
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkguard.cli import main
from linkguard.models import CableRef, PhysState, PortStateName
from linkguard.simulations.scenario import (
    EVENT_KINDS,
    FAULT_KINDS,
    MAX_EVENTS,
    SCENARIOS_DIR,
    SCHEMA,
    LoadedScenario,
    ScenarioError,
    dump_scenario,
    expand,
    load_scenario,
    shipped_scenarios,
)
from linkguard.topology.fabric import dump_fabric
from linkguard.topology.generator import generate_rail_optimized

#: golden file -> (hosts, rails, timeline entries, events per kind)
GOLDEN = {
    "single-link-down": (4, 4, 2, {"port_down": 1, "port_up": 1}),
    "flapping-link": (4, 4, 1, {"port_down": 5, "port_up": 5}),
    "port-cycle": (4, 4, 2, {"port_down": 4, "port_up": 2}),
    "leaf-reboot": (8, 4, 1, {"switch_down": 1, "switch_up": 1, "port_down": 4, "port_up": 4}),
    "large-leaf-reboot": (
        16,
        4,
        1,
        {"switch_down": 1, "switch_up": 1, "port_down": 8, "port_up": 8},
    ),
    "spine-loss": (8, 4, 2, {"switch_down": 2, "switch_up": 1}),
    "uplink-loss": (16, 4, 5, {"cables_down": 5, "cables_up": 5}),
    "broker-outage": (4, 4, 3, {"broker_down": 1, "broker_up": 1, "port_down": 1, "port_up": 1}),
    "service-restart": (
        4,
        4,
        3,
        {"service_down": 1, "service_up": 1, "port_down": 1, "port_up": 1},
    ),
    "agent-restart": (4, 4, 3, {"agent_down": 1, "agent_up": 1, "port_down": 1, "port_up": 1}),
    "fast-path-only": (
        4,
        4,
        5,
        {"service_down": 1, "service_up": 1, "port_down": 2, "port_up": 2},
    ),
    "job-link-down": (4, 4, 2, {"port_down": 1, "port_up": 1}),
    "lab-chaos": (4, 2, 0, {}),  # a chaos: section instead of a timeline (sim lab)
    "job-flapping-link": (4, 4, 1, {"port_down": 4, "port_up": 4}),
    "faults-across-outage": (
        16,
        4,
        6,
        {
            "cables_down": 4,
            "cables_up": 4,
            "broker_down": 1,
            "broker_up": 1,
            "service_down": 1,
            "service_up": 1,
        },
    ),
}

DOWN = (PortStateName.DOWN, PhysState.POLLING)
UP = (PortStateName.ACTIVE, PhysState.LINK_UP)


def golden(name: str) -> LoadedScenario:
    return load_scenario(SCENARIOS_DIR / f"{name}.yaml")


def base_doc(**over: object) -> dict:
    """A valid scenario on a 4-host x 4-rail, single-SU fabric with 2 spines."""
    doc = {
        "schema": SCHEMA,
        "name": "t",
        "description": "test",
        "fabric": {"generate": {"hosts": 4, "rails": 4, "hosts_per_su": 4, "spines_per_su": 2}},
        "duration_s": 20,
        "timeline": [],
    }
    doc.update(over)
    return doc


def write(tmp_path: Path, doc: object, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def error(tmp_path: Path, doc: object) -> str:
    path = write(tmp_path, doc)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def timeline_error(tmp_path: Path, *entries: dict, **over: object) -> str:
    return error(tmp_path, base_doc(timeline=list(entries), **over))


# --------------------------------------------------------------------------------------------
# Golden files


def test_every_golden_file_is_listed() -> None:
    assert [p.stem for p in shipped_scenarios()] == sorted(GOLDEN)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_file_loads_and_expands(name: str) -> None:
    hosts, rails, entries, kinds = GOLDEN[name]
    loaded = golden(name)
    sc = loaded.scenario
    assert sc.name == name and sc.version == SCHEMA
    assert len(sc.description) > 100  # says what it shows
    assert sc.fabric.generate is not None
    assert (len(loaded.fabric.hosts), len(loaded.fabric.rails)) == (hosts, rails)
    assert 4 <= hosts <= 16 and sc.duration_s <= 30
    assert len(sc.timeline) == entries
    events = expand(loaded)
    assert Counter(e.kind for e in events) == kinds
    times = [e.at_s for e in events]
    assert times == sorted(times)
    assert all(0 <= t <= sc.duration_s for t in times)
    assert expand(loaded) == events  # deterministic


def test_single_link_down_events() -> None:
    events = expand(golden("single-link-down"))
    fields = [
        (e.at_s, e.kind, e.host, e.rail, e.hca, e.port, e.state, e.phys_state) for e in events
    ]
    assert fields == [
        (2.0, "port_down", "gpu001", 1, "mlx5_1", 1, *DOWN),
        (8.0, "port_up", "gpu001", 1, "mlx5_1", 1, *UP),
    ]
    sc = golden("single-link-down").scenario
    assert sc.damping is not None and sc.damping.hold_down_initial_s == 2.0
    assert sc.expect.reachability is True and sc.expect.max_reroute_ms == 1000


def test_port_cycle_trains_through_linkup() -> None:
    events = expand(golden("port-cycle"))
    assert [(e.at_s, e.host, e.kind, e.state, e.phys_state) for e in events] == [
        (2.0, "gpu000", "port_down", *DOWN),
        (3.5, "gpu000", "port_down", PortStateName.DOWN, PhysState.LINK_UP),
        (4.0, "gpu000", "port_up", *UP),
        (8.0, "gpu003", "port_down", *DOWN),
        (9.0, "gpu003", "port_down", PortStateName.DOWN, PhysState.LINK_UP),
        (12.0, "gpu003", "port_up", *UP),
    ]


def test_leaf_reboot_takes_the_switch_and_its_host_ports() -> None:
    events = expand(golden("leaf-reboot"))
    assert [(e.at_s, e.kind, e.switch or e.host) for e in events] == [
        (2.0, "switch_down", "su0-leaf2"),
        *[(2.0, "port_down", f"gpu00{h}") for h in range(4)],
        (7.0, "switch_up", "su0-leaf2"),
        *[(7.0, "port_up", f"gpu00{h}") for h in range(4)],
    ]
    assert {e.rail for e in events if e.host} == {2}
    assert golden("leaf-reboot").scenario.expect.max_plans_per_host_per_event == 2


def test_flap_cycles_with_seeded_jitter(tmp_path: Path) -> None:
    loaded = golden("flapping-link")
    events = expand(loaded)
    assert [e.kind for e in events] == ["port_down", "port_up"] * 5
    # cycle k: down in [2 + 2k, 2.2 + 2k], up in [3 + 2k, 3.2 + 2k]
    for k in range(5):
        down, up = events[2 * k].at_s, events[2 * k + 1].at_s
        assert 2 + 2 * k <= down <= 2.2 + 2 * k and 3 + 2 * k <= up <= 3.2 + 2 * k
    assert len({round(e.at_s % 1, 6) for e in events}) > 1  # jittered, not on the grid
    # same seed: same times (also from another file); another seed: other times
    doc = yaml.safe_load((SCENARIOS_DIR / "flapping-link.yaml").read_text())
    assert expand(load_scenario(write(tmp_path, doc, "a.yaml"))) == events
    doc["seed"] = 8
    assert [e.at_s for e in expand(load_scenario(write(tmp_path, doc, "b.yaml")))] != [
        e.at_s for e in events
    ]
    # no jitter: exactly on the half periods; a tail shorter than a period is not a cycle
    entry = {"at_s": 1, "kind": "flap", "host": "gpu000", "rail": 0, "period_s": 0.1}
    plain = load_scenario(write(tmp_path, base_doc(timeline=[{**entry, "duration_s": 0.35}])))
    assert [e.at_s for e in expand(plain)] == [1.0, 1.05, 1.1, 1.15, 1.2, 1.25]


def test_spine_and_uplink_events() -> None:
    spine = expand(golden("spine-loss"))
    assert [(e.at_s, e.kind, e.switch) for e in spine] == [
        (2.0, "switch_down", "su1-spine0"),
        (8.0, "switch_up", "su1-spine0"),
        (12.0, "switch_down", "su0-spine1"),  # for good
    ]
    uplink = expand(golden("uplink-loss"))
    assert uplink[0].cable == CableRef(a="su0-leaf1", b="su0-spine0", count=1)
    cut = [e.cable for e in uplink if e.at_s == 10.0]
    assert [(c.a, c.b, c.count) for c in cut] == [
        ("su1-leaf3", s, None) for s in ("su0-spine0", "su0-spine1", "su1-spine0", "su1-spine1")
    ]


def test_restarts_and_outages() -> None:
    assert [(e.at_s, e.kind, e.host) for e in expand(golden("agent-restart"))] == [
        (2.0, "agent_down", "gpu003"),
        (3.0, "port_down", "gpu003"),
        (5.0, "agent_up", "gpu003"),
        (10.0, "port_up", "gpu003"),
    ]
    assert [(e.at_s, e.kind) for e in expand(golden("broker-outage"))] == [
        (2.0, "broker_down"),
        (4.0, "port_down"),
        (7.0, "broker_up"),
        (12.0, "port_up"),
    ]
    assert [(e.at_s, e.kind) for e in expand(golden("service-restart"))][::2] == [
        (2.0, "service_down"),
        (5.0, "service_up"),
    ]


def test_same_instant_orders_by_entry(tmp_path: Path) -> None:
    doc = base_doc(
        timeline=[
            {"at_s": 3, "kind": "link_down", "host": "gpu001", "rail": 0},
            {"at_s": 3, "kind": "broker_outage", "duration_s": 1},
            {"at_s": 1, "kind": "service_restart", "down_s": 2},
        ]
    )
    events = expand(load_scenario(write(tmp_path, doc)))
    assert [(e.at_s, e.kind, e.entry) for e in events] == [
        (1.0, "service_down", 2),
        (3.0, "port_down", 0),
        (3.0, "broker_down", 1),
        (3.0, "service_up", 2),
        (4.0, "broker_up", 1),
    ]


def test_fabric_from_a_file_relative_to_the_scenario(tmp_path: Path) -> None:
    fabric = generate_rail_optimized(hosts=3, rails=2, hosts_per_su=4, spines_per_su=1)
    (tmp_path / "fabrics").mkdir()
    (tmp_path / "fabrics" / "f.yaml").write_text(dump_fabric(fabric, "yaml"))
    (tmp_path / "sc").mkdir()
    doc = base_doc(
        fabric={"file": "../fabrics/f.yaml"},
        timeline=[{"at_s": 1, "kind": "link_down", "host": "gpu002", "rail": 1}],
    )
    loaded = load_scenario(write(tmp_path / "sc", doc))
    assert loaded.fabric == fabric
    assert [(e.host, e.hca) for e in expand(loaded)] == [("gpu002", "mlx5_1")]


# --------------------------------------------------------------------------------------------
# Validation errors


def test_file_and_document_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError, match=r"nope.yaml: cannot read scenario file"):
        load_scenario(missing)
    assert error(tmp_path, "a: [1, 2\n").startswith("not valid YAML")
    assert error(tmp_path, "- 1\n- 2\n") == (
        "expected a mapping with schema/name/fabric/timeline, got list"
    )
    doc = base_doc()
    del doc["schema"]
    assert error(tmp_path, doc) == f"no schema: key; this linkguard reads `schema: {SCHEMA}`"
    assert error(tmp_path, base_doc(schema="linkguard.scenario/v2")) == (
        f"schema 'linkguard.scenario/v2'; this linkguard reads `schema: {SCHEMA}`"
    )


def test_schema_errors_name_the_field(tmp_path: Path) -> None:
    assert error(tmp_path, base_doc(colour="red")) == "colour: Extra inputs are not permitted"
    assert error(tmp_path, base_doc(duration_s=0)) == ("duration_s: Input should be greater than 0")
    assert error(tmp_path, base_doc(duration_s=".inf")) == (
        "duration_s: Input should be a valid number, unable to parse string as a number"
    )
    assert error(tmp_path, base_doc(fabric={})) == (
        "fabric: give either generate: (generator parameters) or file: (a path)"
    )
    assert error(tmp_path, base_doc(damping={"reuse_threshold": 3000})).startswith(
        "damping: reuse_threshold (3000) must be below suppress_threshold (2000)"
    )
    assert error(tmp_path, base_doc(debounce_ms=-1)) == (
        "debounce_ms: Input should be greater than or equal to 0"
    )
    assert error(tmp_path, base_doc(expect={"max_reroute_ms": 0})) == (
        "expect.max_reroute_ms: Input should be greater than 0"
    )


def test_timeline_schema_errors_name_the_entry(tmp_path: Path) -> None:
    port = {"host": "gpu001", "rail": 1}
    flap = {"at_s": 1, "kind": "flap", **port, "period_s": 2, "duration_s": 4}
    assert timeline_error(tmp_path, {**flap, "period_s": 0}) == (
        "timeline[0] (flap): period_s: Input should be greater than 0.01"
    )
    assert timeline_error(tmp_path, {**flap, "duration_s": 1}) == (
        "timeline[0] (flap): duration_s 1 is shorter than one period (2 s)"
    )
    assert timeline_error(tmp_path, {**flap, "jitter_s": 1}) == (
        "timeline[0] (flap): jitter_s 1 must be below half the period (1 s), or a flap's up "
        "could come before its down"
    )
    assert timeline_error(tmp_path, {"at_s": 1, "kind": "reboot_everything"}).startswith(
        "timeline[0]: Input tag 'reboot_everything' found using 'kind' does not match any of "
        "the expected tags: 'link_down', 'link_up', 'flap'"
    )
    assert timeline_error(tmp_path, {"at_s": 1, **port}).startswith(
        "timeline[0]: Unable to extract tag using discriminator 'kind'"
    )
    assert timeline_error(tmp_path, {"at_s": -1, "kind": "link_down", **port}) == (
        "timeline[0] (link_down): at_s: Input should be greater than or equal to 0"
    )
    assert timeline_error(
        tmp_path, {"at_s": 1, "kind": "port_cycle", **port, "polling_s": 1, "linkup_s": 0}
    ) == ("timeline[0] (port_cycle): linkup_s: Input should be greater than 0")
    assert timeline_error(tmp_path, {"at_s": 1, "kind": "link_up", **port, "rate": 1}) == (
        "timeline[0] (link_up): rate: Extra inputs are not permitted"
    )
    assert timeline_error(
        tmp_path, {"at_s": 1, "kind": "uplink_loss", "a": "su0-leaf0", "b": "su0-leaf0"}
    ) == ("timeline[0] (uplink_loss): a cable joins two switches, not 'su0-leaf0' to itself")


def test_names_are_checked_against_the_fabric(tmp_path: Path) -> None:
    ok = {"at_s": 1, "kind": "link_down", "host": "gpu000", "rail": 0}
    flap = {"at_s": 1, "kind": "flap", "period_s": 1, "duration_s": 2}

    def entry3(entry: dict) -> str:  # the bad entry is timeline[3]
        others = [{**ok, "host": f"gpu00{h}"} for h in range(3)]
        return timeline_error(tmp_path, *others, entry)

    assert entry3({**flap, "host": "gpu999", "rail": 0}) == (
        "timeline[3] (flap): host 'gpu999' is not in the fabric"
    )
    assert entry3({**flap, "host": "gpu003", "rail": 7}) == (
        "timeline[3] (flap): host 'gpu003' has no HCA on rail 7 (its rails: 0, 1, 2, 3)"
    )
    assert entry3({"at_s": 1, "kind": "agent_restart", "host": "gpu9", "down_s": 1}) == (
        "timeline[3] (agent_restart): host 'gpu9' is not in the fabric"
    )
    assert entry3({"at_s": 1, "kind": "leaf_reboot", "leaf": "su0-spine0", "down_s": 1}) == (
        "timeline[3] (leaf_reboot): switch 'su0-spine0' is a spine, not a leaf"
    )
    assert entry3({"at_s": 1, "kind": "leaf_reboot", "leaf": "su9-leaf0", "down_s": 1}) == (
        "timeline[3] (leaf_reboot): switch 'su9-leaf0' is not in the fabric"
    )
    assert entry3({"at_s": 1, "kind": "spine_loss", "spine": "su0-leaf1"}) == (
        "timeline[3] (spine_loss): switch 'su0-leaf1' is a leaf, not a spine"
    )
    cables = {"at_s": 1, "kind": "uplink_loss"}
    assert entry3({**cables, "a": "su0-leaf0", "b": "su0-leaf1"}) == (
        "timeline[3] (uplink_loss): no switch-to-switch cable between 'su0-leaf0' and "
        "'su0-leaf1' in the fabric"
    )
    # the generated 4-host SU cables each leaf twice to each of its 2 spines
    assert entry3({**cables, "a": "su0-spine1", "b": "su0-leaf2", "count": 3}) == (
        "timeline[3] (uplink_loss): count 3 but there are 2 cable(s) between 'su0-spine1' "
        "and 'su0-leaf2'"
    )


def test_times_must_fit_the_duration(tmp_path: Path) -> None:
    port = {"host": "gpu001", "rail": 1}
    assert timeline_error(tmp_path, {"at_s": 21, "kind": "link_down", **port}) == (
        "timeline[0] (link_down): starts at 21 s, after the scenario's duration_s 20"
    )
    assert timeline_error(
        tmp_path, {"at_s": 15, "kind": "flap", **port, "period_s": 2, "duration_s": 6}
    ) == ("timeline[0] (flap): ends at 21 s, after the scenario's duration_s 20")
    assert timeline_error(tmp_path, {"at_s": 18, "kind": "service_restart", "down_s": 2.5}) == (
        "timeline[0] (service_restart): ends at 20.5 s, after the scenario's duration_s 20"
    )
    # ending exactly at the end is fine; so is a spine lost for good
    fine = [
        {"at_s": 18, "kind": "broker_outage", "duration_s": 2},
        {"at_s": 19, "kind": "spine_loss", "spine": "su0-spine0"},
    ]
    assert len(expand(load_scenario(write(tmp_path, base_doc(timeline=fine))))) == 3


def test_conflicting_entries(tmp_path: Path) -> None:
    down = {"at_s": 2, "kind": "link_down", "host": "gpu001", "rail": 1}
    up = {**down, "at_s": 6, "kind": "link_up"}
    assert timeline_error(tmp_path, up) == (
        "timeline[0] (link_up): gpu001 rail 1 is not down at 6 s (no link_down before it)"
    )
    assert timeline_error(tmp_path, down, {**down, "at_s": 4}) == (
        "timeline[1] (link_down): gpu001 rail 1 is already down (timeline[0] (link_down)); "
        "bring it up with a link_up first"
    )
    flap = {"at_s": 4, "kind": "flap", "host": "gpu001", "rail": 1, "period_s": 1}
    assert timeline_error(tmp_path, down, up, {**flap, "duration_s": 2}) == (
        "timeline[2] (flap): overlaps timeline[0] (link_down) on gpu001 rail 1 (held from 2 s "
        "until 6 s)"
    )
    # a leaf reboot holds its hosts' ports; a down port that never comes back holds it to the end
    reboot = {"at_s": 10, "kind": "leaf_reboot", "leaf": "su0-leaf1", "down_s": 2}
    assert timeline_error(tmp_path, down, reboot) == (
        "timeline[1] (leaf_reboot): overlaps timeline[0] (link_down) on gpu001 rail 1 (held "
        "from 2 s until the end)"
    )
    broker = {"at_s": 1, "kind": "broker_outage", "duration_s": 5}
    assert timeline_error(tmp_path, broker, {**broker, "at_s": 3}) == (
        "timeline[1] (broker_outage): overlaps timeline[0] (broker_outage) on the broker (held "
        "from 1 s until 6 s)"
    )
    # the same cable pair named either way round
    cut = {"at_s": 1, "kind": "uplink_loss", "a": "su0-leaf0", "b": "su0-spine0", "count": 1}
    swapped = {**cut, "a": "su0-spine0", "b": "su0-leaf0"}
    assert timeline_error(tmp_path, {**cut, "at_s": 5}, swapped) == (
        "timeline[0] (uplink_loss): overlaps timeline[1] (uplink_loss) on the cables between "
        "su0-leaf0 and su0-spine0 (held from 1 s until the end)"
    )
    spine = {"at_s": 1, "kind": "spine_loss", "spine": "su0-spine1", "duration_s": 2}
    agent = {"at_s": 1, "kind": "agent_restart", "host": "gpu002", "down_s": 2}
    assert timeline_error(tmp_path, spine, {**spine, "at_s": 1}).startswith(
        "timeline[1] (spine_loss): overlaps timeline[0] (spine_loss) on switch su0-spine1"
    )
    assert timeline_error(tmp_path, agent, {**agent, "at_s": 2.5}).startswith(
        "timeline[1] (agent_restart): overlaps timeline[0] (agent_restart) on the agent of gpu002"
    )
    # back to back is fine: down 2-6, then a flap from 6
    ok = base_doc(timeline=[down, up, {**flap, "at_s": 6, "duration_s": 2}])
    assert len(expand(load_scenario(write(tmp_path, ok)))) == 6


def test_fabric_errors(tmp_path: Path) -> None:
    gen = {"hosts": 4, "rails": 4, "hosts_per_su": 4, "management_hosts_per_su": 4}
    assert error(tmp_path, base_doc(fabric={"generate": gen})) == (
        "fabric.generate: management_hosts_per_su must be 0..3 (below hosts_per_su), got 4"
    )
    assert error(tmp_path, base_doc(fabric={"generate": {"hosts": 4}})) == (
        "fabric.generate.rails: Field required"
    )
    assert error(tmp_path, base_doc(fabric={"generate": {"hosts": 16384, "rails": 64}})) == (
        "fabric.generate: 16384 hosts x 64 rails is above 131,072 host ports"
    )
    message = error(tmp_path, base_doc(fabric={"file": "missing.yaml"}))
    assert message.startswith(f"fabric.file: {tmp_path / 'missing.yaml'}: cannot read fabric")
    both = {"file": "f.yaml", "generate": {"hosts": 4, "rails": 4}}
    assert error(tmp_path, base_doc(fabric=both)) == (
        "fabric: give either generate: (generator parameters) or file: (a path)"
    )
    # a fabric the service could not serve (imported, no netdevs) is refused
    doc = yaml.safe_load(dump_fabric(generate_rail_optimized(hosts=2, rails=2), "yaml"))
    for h in doc["hosts"]:
        for c in h["hcas"]:
            del c["netdev"]
    write(tmp_path, doc, "bare.yaml")
    assert "the topology service cannot serve this fabric" in error(
        tmp_path, base_doc(fabric={"file": "bare.yaml"})
    )


def test_event_bound(tmp_path: Path) -> None:
    flap = {"at_s": 0, "kind": "flap", "host": "gpu000", "rail": 0, "period_s": 0.02}
    assert timeline_error(tmp_path, {**flap, "duration_s": 20_000}, duration_s=20_000) == (
        f"timeline: 2,000,000 events; at most {MAX_EVENTS:,} per scenario"
    )


# --------------------------------------------------------------------------------------------
# Round trip


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_round_trip(tmp_path: Path, name: str) -> None:
    loaded = golden(name)
    text = dump_scenario(loaded.scenario)
    assert text.startswith(f"schema: {SCHEMA}\nname: {name}\n")
    again = load_scenario(write(tmp_path, text))
    assert again.scenario == loaded.scenario
    assert again.fabric == loaded.fabric
    assert expand(again) == expand(loaded)
    assert dump_scenario(again.scenario) == text


# --------------------------------------------------------------------------------------------
# Property: anything YAML-ish fails only with ScenarioError

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)
#: mostly valid values, sometimes not (a strategy per field keeps most documents loadable, so
#: the checks against the fabric run too, not only the schema)
bad_times = st.sampled_from([-1, 0, 0.01, 25, math.nan, math.inf, "5", None])
times = st.integers(0, 12) | st.floats(0, 12) | st.integers(0, 6) | bad_times
hosts = st.sampled_from(["gpu000", "gpu001", "gpu002", "gpu003", "gpu019", "gpu999", ""])
switches = st.sampled_from(["su0-leaf0", "su0-leaf1", "su1-leaf0", "su0-spine0", "su0-spine1"])
FIELDS = {
    "host": hosts,
    "rail": st.integers(-1, 5),
    "period_s": times,
    "duration_s": times | st.none(),
    "jitter_s": times,
    "polling_s": times,
    "linkup_s": times,
    "down_s": times,
    "leaf": switches,
    "spine": switches,
    "a": switches,
    "b": switches,
    "count": st.integers(0, 5) | st.none(),
}
KIND_FIELDS = {
    "link_down": ["host", "rail"],
    "link_up": ["host", "rail"],
    "flap": ["host", "rail", "period_s", "duration_s", "jitter_s"],
    "port_cycle": ["host", "rail", "polling_s", "linkup_s"],
    "leaf_reboot": ["leaf", "down_s"],
    "spine_loss": ["spine", "duration_s"],
    "uplink_loss": ["a", "b", "count", "duration_s"],
    "broker_outage": ["duration_s"],
    "service_restart": ["down_s"],
    "agent_restart": ["host", "down_s"],
}


@st.composite
def entries(draw) -> dict:
    kind = draw(st.sampled_from([*FAULT_KINDS, "bogus"]))
    entry = {"at_s": draw(times), "kind": kind}
    for name in KIND_FIELDS.get(kind, []):
        if draw(st.integers(0, 9)):  # sometimes left out
            entry[name] = draw(FIELDS[name])
    return entry


@st.composite
def documents(draw) -> object:
    gen = {
        "hosts": draw(st.integers(1, 8) | st.integers(0, 20)),
        "rails": draw(st.integers(1, 4) | st.integers(0, 5)),
        "hosts_per_su": draw(st.integers(4, 20) | st.integers(1, 20)),
        "spines_per_su": draw(st.integers(1, 3) | st.integers(0, 3)),
    }
    fabric = draw(st.sampled_from([{"generate": gen}] * 9 + [{"file": draw(st.text())}]))
    doc: dict = {
        "schema": draw(st.sampled_from([*[SCHEMA] * 8, "v0", None])),
        "name": draw(st.sampled_from([*["ok"] * 8, "", "bad name"])),
        "description": "d",
        "fabric": fabric,
        "duration_s": draw(st.integers(10, 25) | st.integers(10, 25) | times),
        "seed": draw(st.integers(0, 2**63) | st.integers(-1, 2**64)),
        "timeline": draw(st.lists(entries(), max_size=5)),
    }
    if draw(st.booleans()):
        doc["damping"] = {"hold_down_initial_s": draw(times)}
    # then break it somewhere, or not
    how = draw(st.integers(0, 9))
    if how == 7:
        doc[draw(st.sampled_from([*doc, "extra"]))] = draw(junk)
    elif how == 8 and doc["timeline"]:
        i = draw(st.integers(0, len(doc["timeline"]) - 1))
        entry = doc["timeline"][i]
        entry[draw(st.sampled_from([*entry, "extra"]))] = draw(junk)
    elif how == 9:
        return draw(junk)
    return doc


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=documents())
def test_loading_anything_raises_only_scenario_error(tmp_path: Path, doc: object) -> None:
    path = write(tmp_path, yaml.safe_dump(copy.deepcopy(doc)))
    try:
        loaded = load_scenario(path)
    except ScenarioError as exc:
        assert str(exc).startswith(f"{path}: ")
        return
    events = expand(loaded)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    assert all(0 <= e.at_s <= loaded.scenario.duration_s for e in events)
    assert {e.kind for e in events} <= set(EVENT_KINDS)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=200))
def test_loading_any_text_raises_only_scenario_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError):
        load_scenario(path)


# --------------------------------------------------------------------------------------------
# CLI


def test_cli_check_all_golden_files(capsys) -> None:
    files = [str(p) for p in shipped_scenarios()]
    assert main(["sim", "check", *files]) == 0
    out = capsys.readouterr().out
    for name in GOLDEN:
        assert f"{SCENARIOS_DIR / name}.yaml: ok" in out
    assert "fabric: generated, 8 hosts x 4 rails, 8 leaves, 4 spines" in out
    assert "10 events: port_down 4, port_up 4, switch_down 1, switch_up 1" in out
    assert "2.000 s  switch_down su0-leaf2  [timeline[0]]" in out


def test_cli_check_exit_codes(tmp_path: Path, capsys) -> None:
    good = str(SCENARIOS_DIR / "single-link-down.yaml")
    bad = write(
        tmp_path,
        base_doc(timeline=[{"at_s": 1, "kind": "link_down", "host": "gpu999", "rail": 0}]),
    )
    assert main(["sim", "check", str(bad), good, "--events", "0"]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"linkguard: {bad}: timeline[0] (link_down): host 'gpu999' is not in the fabric\n"
    )
    assert f"{good}: ok" in out and "first" not in out  # the valid one is still checked
    with pytest.raises(SystemExit) as info:
        main(["sim", "check"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["sim", "check", "--help"])
    assert info.value.code == 0
    assert "Exit codes: 0 every file is valid" in capsys.readouterr().out


def test_readme_example_is_valid(tmp_path: Path) -> None:
    """The scenario example of docs/simulations.md (once the README's) loads and expands."""
    readme = (Path(__file__).parents[2] / "docs" / "simulations.md").read_text()
    section = readme[readme.index("## Scenarios") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 10)]
    loaded = load_scenario(write(tmp_path, example))
    assert loaded.scenario.debounce_ms == 50
    assert Counter(e.kind for e in expand(loaded)) == {"port_down": 5, "port_up": 5}


def test_fault_kinds_are_the_documented_ten() -> None:
    assert FAULT_KINDS == (
        "link_down",
        "link_up",
        "flap",
        "port_cycle",
        "leaf_reboot",
        "spine_loss",
        "uplink_loss",
        "broker_outage",
        "service_restart",
        "agent_restart",
    )
