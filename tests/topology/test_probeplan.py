"""The probe plan: bounded fan-out, coverage, determinism, rotation, and the fleet's probe load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.probeplan import (
    PortId,
    ProbeSettings,
    epochs_to_cover,
    plan_probes,
    probe_load,
)


def test_fan_out_is_bounded_and_every_port_has_m_probers() -> None:
    fabric = generate_rail_optimized(hosts=64, rails=8)  # 2 SUs of 32 hosts
    s = ProbeSettings()
    plan = plan_probes(fabric, s, seed=7, epoch=3)
    assert len(plan.targets) == 64 * 8
    probers = plan.probers()
    for p, ts in plan.targets.items():
        assert len(ts) == s.fan_out  # exactly k, no duplicates, never itself
        assert p not in ts
        assert all(t.rail == p.rail for t in ts)  # probes stay on the rail
        assert len(probers[p]) >= s.min_probers
        # in-leaf and across: fan_out - cross_su on its own leaf, cross_su on the other SU's
        same = [t for t in ts if plan.leaf[t] == plan.leaf[p]]
        assert len(same) == s.fan_out - s.cross_su
    # equal SUs: the circulant makes in-degree exactly fan_out (per-port load bounded)
    assert {len(q) for q in probers.values()} == {s.fan_out}
    assert plan.under_covered(s.min_probers) == []
    assert plan.leaf[PortId("gpu000", 3)] == "su0-leaf3"
    assert plan.leaf[PortId("gpu040", 3)] == "su1-leaf3"


def test_deterministic_in_seed_and_epoch() -> None:
    fabric = generate_rail_optimized(hosts=64, rails=2)
    a = plan_probes(fabric, seed=1, epoch=5)
    assert a == plan_probes(fabric, seed=1, epoch=5)
    assert a.targets != plan_probes(fabric, seed=2, epoch=5).targets
    assert a.targets != plan_probes(fabric, seed=1, epoch=6).targets


def test_rotation_covers_every_pair_of_a_rail() -> None:
    fabric = generate_rail_optimized(hosts=12, rails=2, hosts_per_su=4)  # 3 SUs x 4 hosts
    s = ProbeSettings(fan_out=3, cross_su=1)
    epochs = epochs_to_cover(4, 3, s)
    assert epochs == 8  # cross: (3 - 1) leaves x 4 positions / 1 slot; in-leaf: 3 / 2 -> 2
    seen: set[tuple[PortId, PortId]] = set()
    for e in range(epochs):
        plan = plan_probes(fabric, s, seed=3, epoch=e)
        seen |= {(p, t) for p, ts in plan.targets.items() for t in ts}
    ports = list(plan_probes(fabric, s).targets)
    want = {(p, t) for p in ports for t in ports if p != t and p.rail == t.rail}
    assert seen == want  # all 2 rails x 12 x 11 ordered pairs


def test_small_fabric_reports_under_covered_ports() -> None:
    fabric = generate_rail_optimized(hosts=3, rails=1)  # one leaf of 3: at most 2 probers
    plan = plan_probes(fabric, ProbeSettings(fan_out=4, cross_su=0))
    assert {len(ts) for ts in plan.targets.values()} == {2}
    assert len(plan.under_covered(3)) == 3


def test_probe_load_2048_hosts_x_8_rails() -> None:
    load = probe_load(2048, 8)
    assert load.ports == 16_384  # = 16,384 GPUs at 8 GPUs (one per rail) per host
    assert load.probes_pps == 2048 * 8 * 4 * 1.0 == 65_536
    assert load.total_pps == 131_072
    assert load.per_port_pps == 16
    assert load.total_bps == 131_072 * 102 * 8  # ~107 Mb/s across the whole fleet
    worst = probe_load(2048, 8, ProbeSettings(fan_out=16, cross_su=2, rate_pps=1.0))
    assert worst.total_pps == 524_288  # the stated bound: fan_out x rate <= 16 per port
    assert worst.per_port_pps == 64


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"fan_out": 8, "rate_pps": 4}, "32 probes/s per port > 16"),
        ({"fan_out": 2, "cross_su": 3}, "cross_su 3 > fan_out 2"),
        ({"rate_pps": 0}, "greater than 0"),
    ],
)
def test_settings_enforce_the_bound(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        ProbeSettings(**kwargs)


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="epoch -1"):
        plan_probes(generate_rail_optimized(hosts=4, rails=1), epoch=-1)
    with pytest.raises(ValueError, match="must be >= 0"):
        probe_load(-1, 8)
