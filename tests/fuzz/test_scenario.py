"""Scenario loading on damaged shipped scenarios (bytes, and YAML documents with a value
replaced, a key dropped or added) and on random YAML: ScenarioError or a scenario that
expands, nothing else."""

from __future__ import annotations

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz.strategies import json_values, mutated, mutated_doc, yaml_scalars
from fuzz.targets import scenario
from linkguard.simulations.scenario import shipped_scenarios
from tests.fuzz.profiles import FUZZ

SHIPPED = [p.read_bytes() for p in shipped_scenarios()]
DOCS = [yaml.safe_load(b) for b in SHIPPED]


def _dump(doc: object) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


@FUZZ
@given(st.sampled_from(SHIPPED).flatmap(mutated))
def test_mutated_shipped_scenario_files(data: bytes) -> None:
    scenario(data)


@FUZZ
@given(st.sampled_from(DOCS).flatmap(lambda d: mutated_doc(d, yaml_scalars)).map(_dump))
def test_shipped_scenarios_with_one_value_changed(data: bytes) -> None:
    scenario(data)


_KEYS = ["schema", "name", "description", "fabric", "duration_s", "seed", "damping"]
_KEYS += ["debounce_ms", "timeline", "expect"]
_ENTRY_KEYS = ["at_s", "kind", "host", "rail", "leaf", "spine", "a", "b", "count"]
_ENTRY_KEYS += ["period_s", "duration_s", "jitter_s", "down_s", "polling_s", "linkup_s"]
_KINDS = ["link_down", "link_up", "flap", "port_cycle", "leaf_reboot", "spine_loss"]
_KINDS += ["uplink_loss", "broker_outage", "service_restart", "agent_restart"]

_entry = st.dictionaries(
    st.sampled_from(_ENTRY_KEYS),
    st.one_of(yaml_scalars, st.sampled_from(_KINDS), st.sampled_from(["gpu001", "su0-leaf1"])),
    max_size=7,
)
_random_scenario = st.fixed_dictionaries(
    {
        "schema": st.sampled_from(["linkguard.scenario/v1", "linkguard.scenario/v2"]),
        "name": st.sampled_from(["fuzz", "a b", ""]),
        "description": st.text(max_size=8),
        "fabric": st.one_of(
            st.fixed_dictionaries(
                {"generate": st.dictionaries(st.sampled_from(["hosts", "rails"]), yaml_scalars)}
            ),
            st.fixed_dictionaries({"file": st.sampled_from(["fabric.yaml", "none.yaml", ""])}),
            json_values(max_leaves=3),
        ),
        "duration_s": yaml_scalars,
        "timeline": st.lists(_entry, max_size=4),
    },
    optional={k: yaml_scalars for k in ("seed", "damping", "debounce_ms", "expect")},
)


@FUZZ
@given(st.one_of(_random_scenario, st.dictionaries(st.sampled_from(_KEYS), yaml_scalars)))
def test_random_scenario_documents(doc: dict) -> None:
    scenario(_dump(doc))


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes(data: bytes) -> None:
    scenario(data)
