"""The lab chaos run's checks (:mod:`linkguard.simulations.labchaoscheck`) and its ``chaos:``
scenario section. The run itself (``linkguard sim lab simulations/scenarios/lab-chaos.yaml``:
the real kernel, agents and service behind the chaos proxy) is a step of ``.ci/run``, not a
test here: the same minute of work twice would not fit CI's budget.

Here: the route check on a real namespace's ``ip -j route`` dump (a plan put in place by the
agent's own :class:`~drivers.routes.RouteTable`, then a leaked, a duplicated and a removed
route), the outage check against a report (an outage reported twice, one invented, one at the
service's time instead of the agent's), and the section's validation.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from linkguard.agent.applier import kernel_routes
from linkguard.agent.plans import effective
from linkguard.drivers.routes import RouteTable
from linkguard.models import Plan
from linkguard.simulations.lab import Lab
from linkguard.simulations.labchaoscheck import (
    Episode,
    down_episodes,
    expected_routes,
    outage_problems,
    route_problems,
    rule_problems,
)
from linkguard.simulations.scenario import SCENARIOS_DIR, ScenarioError, load_scenario
from tests.agent.plan_parts import prefix_route, route
from tests.support import require_root

TABLE = 4242

# rail-1 endpoints over both rails, rail 0's over rail 0, one /32 exception, one endpoint with
# no path (the lab host's rails are 10.100.0.1/24 and 10.100.1.1/24)
PLAN = Plan(
    host="host0",
    epoch=7,
    issued_at=1.0,
    prefix_routes=[prefix_route("10.200.0.0/24", 0, 0), prefix_route("10.200.1.0/24", 1, 0, 1)],
    routes=[route("10.200.1.5", 0, home=1)],
    unreachable=["10.200.0.9"],
)


def _dump(netns: str, *what: str) -> list[dict]:
    out = subprocess.run(
        ["ip", "-4", "-j", "-n", netns, *what], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out or "[]")


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True)


async def test_the_route_check_on_a_real_namespace_names_leaked_duplicated_and_missing() -> None:
    require_root()
    with Lab.create(hosts=1, rails=2, prefix=None) as lab:
        ns = lab.hosts[0].netns
        async with RouteTable(table=TABLE, netns=ns) as rt:
            result = await rt.reconcile(list(kernel_routes(effective(PLAN, ())).values()))
        assert not result.errors
        connected = [(str(r.network), r.netdev) for r in lab.hosts[0].rails]
        want = expected_routes(PLAN, TABLE, connected)
        assert sum(want.values()) == 6  # 2 prefixes, 1 exception, 1 unreachable, 2 connected
        assert route_problems("host0", want, _dump(ns, "route", "show", "table", "all")) == []
        _ip(ns, "route", "add", "10.200.9.0/24", "dev", "rail0", "table", str(TABLE))
        _ip(ns, "route", "append", "10.200.1.5", "via", "10.100.0.2", "dev", "rail0", "table",
            str(TABLE), "metric", "50")  # fmt: skip
        _ip(ns, "route", "add", "10.200.7.7", "dev", "rail1")  # in main
        _ip(ns, "route", "del", "unreachable", "10.200.0.9", "table", str(TABLE))
        _ip(ns, "rule", "add", "to", "10.200.0.0/16", "lookup", str(TABLE), "priority", "900")
        _ip(ns, "rule", "add", "to", "10.200.0.0/16", "lookup", str(TABLE), "priority", "901")
        problems = route_problems("host0", want, _dump(ns, "route", "show", "table", "all"))
        rules = rule_problems("host0", _dump(ns, "rule", "show"))
    assert problems == [
        "host0: missing route (the plan has it): table 4242 unreachable 10.200.0.9/32 dev - "
        "via None src None",
        "host0: duplicated route (2 times): table 4242 unicast 10.200.1.5/32 dev rail0 via "
        "10.100.0.2 src None",
        "host0: leaked route (not in the plan): table 4242 unicast 10.200.9.0/24 dev rail0 via "
        "None src None",
        "host0: leaked route (not in the plan): table main unicast 10.200.7.7/32 dev rail1 via "
        "None src None",
    ]
    assert len(rules) == 1 and "policy rule 2 times (at different priorities)" in rules[0]


def _event(host: str, seq: int, at: float, previous: str, current: str, hca: str = "mlx5_0"):
    return {"host": host, "journal": "j", "seq": seq, "at": at, "hca": hca, "port": 1,
            "previous": previous, "current": current}  # fmt: skip


EVENTS = [
    _event("a", 1, 100.0, "unknown", "up"),
    _event("a", 2, 110.0, "up", "down"),
    _event("a", 3, 112.5, "down", "held_down"),
    _event("a", 4, 113.0, "held_down", "up"),
    _event("b", 1, 110.4, "up", "down", "mlx5_1"),
    _event("b", 2, 111.0, "down", "held_down", "mlx5_1"),
    _event("a", 5, 120.0, "up", "down"),  # still down at the end
]


def test_episodes_are_a_port_down_until_it_leaves_down_in_the_agent_s_times() -> None:
    assert down_episodes(EVENTS) == [
        Episode("a", "mlx5_0", 1, 110.0, 112.5, 2),
        Episode("b", "mlx5_1", 1, 110.4, 111.0, 1),
        Episode("a", "mlx5_0", 1, 120.0, None, 5),
    ]


def test_the_outage_check_wants_each_outage_once_at_the_agent_s_start_and_length() -> None:
    eps = down_episodes(EVENTS)
    ports = [(1, "a", "mlx5_0", 1), (1, "b", "mlx5_1", 1), (2, "a", "mlx5_0", 1)]
    good = [
        {"id": 1, "at": 110.0, "down_s": 2.5, "open": False},
        {"id": 2, "at": 120.0, "down_s": 9.0, "open": True},
    ]
    assert outage_problems(eps, good, ports) == []
    # the same outage again, an invented one, a start at the service's time
    bad = [
        {"id": 1, "at": 110.0, "down_s": 2.5, "open": False},
        {"id": 2, "at": 120.0, "down_s": 9.0, "open": True},
        {"id": 3, "at": 120.0, "down_s": 9.0, "open": True},
        {"id": 4, "at": 115.0, "down_s": 1.0, "open": False},
    ]
    ports_bad = [*ports, (3, "a", "mlx5_0", 1), (4, "b", "mlx5_1", 1)]
    assert outage_problems(eps, bad, ports_bad) == [
        "outage 3 at 120.000: no port of it went down then (invented or reported twice)",
        "outage 4 at 115.000: no port of it went down then (invented or reported twice)",
    ]
    late = [{"id": 1, "at": 110.9, "down_s": 2.5, "open": False}, good[1]]
    assert outage_problems(eps, late, ports) == [
        "outage 1: starts at 110.900, its first port went down at 110.000 (the agent's time)",
    ]
    still_open = [{"id": 1, "at": 110.0, "down_s": 12.0, "open": True}, good[1]]
    assert outage_problems(eps, still_open, ports) == [
        "outage 1: down_s 12.0 (open True), its longest port episode lasted 2.500 s"
    ]


def test_the_chaos_section_is_validated(tmp_path: Path) -> None:
    loaded = load_scenario(SCENARIOS_DIR / "lab-chaos.yaml")
    spec = loaded.scenario.chaos
    assert spec is not None and (spec.loss, spec.storm_s, spec.cuts) == (0.2, 5.0, 3)
    text = (SCENARIOS_DIR / "lab-chaos.yaml").read_text()
    with_timeline = text + "timeline:\n  - {at_s: 1, kind: link_down, host: gpu000, rail: 0}\n"
    (tmp_path / "t.yaml").write_text(with_timeline)
    with pytest.raises(ScenarioError, match="instead of a timeline"):
        load_scenario(tmp_path / "t.yaml")
    (tmp_path / "l.yaml").write_text(text.replace("loss: 0.2", "loss: 1.5"))
    with pytest.raises(ScenarioError, match="loss"):
        load_scenario(tmp_path / "l.yaml")
    (tmp_path / "s.yaml").write_text(text.replace("storm_s: 5", "storm_s: 45"))
    with pytest.raises(ScenarioError, match="longer than duration_s"):
        load_scenario(tmp_path / "s.yaml")
    (tmp_path / "r.yaml").write_text(text + "  resend_after_s: 3\n")
    with pytest.raises(ScenarioError, match="resend_max_s 2 is below resend_after_s 3"):
        load_scenario(tmp_path / "r.yaml")


def test_sim_run_sends_a_chaos_scenario_to_the_lab(capsys) -> None:
    from linkguard.cli import main

    path = str(SCENARIOS_DIR / "lab-chaos.yaml")
    assert main(["sim", "run", path]) == 2
    assert "runs on the namespace lab (`linkguard sim lab" in capsys.readouterr().err
    assert main(["sim", "lab", "--no-linkguard", path]) == 2
    assert "a chaos: scenario checks linkguard itself" in capsys.readouterr().err


def test_a_port_down_again_joins_the_open_outage_not_its_own_closed_one() -> None:
    # the shape of a sim chaos ledger (CI, stop 30): gpu000's mlx5_1 went down at 3.750 for
    # 0.102 s (outage 5, its own), then again at 4.057 for 0.385 s while outage 6 (other
    # ports, first down at 3.667, replayed late so numbered after 5) was still open: the
    # ledger joined it to outage 6, which the check must accept
    events = [
        _event("gpu000", 9, 3.7496, "up", "down", "mlx5_1"),
        _event("gpu000", 11, 3.8516, "down", "held_down", "mlx5_1"),
        _event("gpu000", 12, 4.0566, "held_down", "down", "mlx5_1"),
        _event("gpu000", 14, 4.4419, "down", "held_down", "mlx5_1"),
        _event("gpu003", 7, 3.6668, "up", "down", "mlx5_0"),
        _event("gpu003", 8, 4.4586, "down", "held_down", "mlx5_0"),
    ]
    eps = down_episodes(events)
    outages = [
        {"id": 5, "at": 3.7496, "down_s": 0.102, "open": False},
        {"id": 6, "at": 3.6668, "down_s": 0.7918, "open": False},
    ]
    ports = [(5, "gpu000", "mlx5_1", 1), (6, "gpu000", "mlx5_1", 1), (6, "gpu003", "mlx5_0", 1)]
    assert outage_problems(eps, outages, ports) == []
    # had the ledger left the second down out of outage 6, it is outage 5's, too long for it
    assert outage_problems(eps, outages, [p for p in ports if p != ports[1]]) == [
        "outage 5: down_s 0.102 (open False), its longest port episode lasted 0.385 s"
    ]


def test_an_outage_whose_first_down_came_late_keeps_the_downs_that_joined_it_first() -> None:
    # the shape of another sim chaos ledger (a loaded machine): gpu003's mlx5_1 went down at
    # 3.869 for 0.967 s while outage 1 (gpu004's 3.381 s down) was open; the ledger opened
    # outage 4 with it, and gpu001's down at 2.921 (0.026 s), released late, joined outage 4
    # and moved its start back. Only that assignment makes every outage right
    events = [
        _event("gpu004", 3, 0.7079, "up", "down", "mlx5_1"),
        _event("gpu004", 4, 4.0889, "down", "held_down", "mlx5_1"),
        _event("gpu003", 3, 1.5560, "up", "down", "mlx5_1"),
        _event("gpu003", 5, 3.2882, "down", "held_down", "mlx5_1"),
        _event("gpu003", 9, 3.8685, "up", "down", "mlx5_1"),
        _event("gpu003", 12, 4.8358, "down", "held_down", "mlx5_1"),
        _event("gpu001", 10, 2.9209, "up", "down", "mlx5_0"),
        _event("gpu001", 11, 2.9466, "down", "held_down", "mlx5_0"),
    ]
    eps = down_episodes(events)
    outages = [
        {"id": 1, "at": 0.7079, "down_s": 3.381, "open": False},
        {"id": 4, "at": 2.9209, "down_s": 0.9673, "open": False},
    ]
    ports = [
        (1, "gpu004", "mlx5_1", 1),
        (1, "gpu003", "mlx5_1", 1),
        (4, "gpu001", "mlx5_0", 1),
        (4, "gpu003", "mlx5_1", 1),
    ]
    assert outage_problems(eps, outages, ports) == []
    # an outage 4 as long as no episode of it: wrong under every assignment, named for the
    # simple one (each down in the outage of its port started last before it)
    wrong = [outages[0], {**outages[1], "down_s": 0.5}]
    assert outage_problems(eps, wrong, ports) == [
        "outage 4: down_s 0.5 (open False), its longest port episode lasted 0.967 s"
    ]
