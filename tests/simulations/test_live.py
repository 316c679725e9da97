"""The real-time replay (linkguard.simulations.live): golden scenarios on a fleet of real
agents and a real service over a private Mosquitto and over the in-memory bus, the oracle on
the routes the agents installed."""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.drivers.routes import KernelRoute
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.simulations.live import (
    LiveReport,
    check_installed,
    percentile,
    run,
    table_egress,
)
from linkguard.simulations.scenario import SCENARIOS_DIR, load_scenario
from linkguard.topology.generator import generate_rail_optimized
from tests.simulations.realdecisions import RecordedRun
from tests.support import require_binary

HOSTS4 = [f"gpu00{i}" for i in range(4)]


def golden(name: str):
    return load_scenario(SCENARIOS_DIR / f"{name}.yaml")


@pytest.fixture
def single_link_down_mosquitto(single_link_down_over_mosquitto: RecordedRun) -> LiveReport:
    """single-link-down over Mosquitto, run once for the tests that read it (here and in
    test_engine_vs_processes.py: ``tests/simulations/conftest.py``)."""
    return single_link_down_over_mosquitto.report


# -- pure parts ----------------------------------------------------------------------------


def test_table_egress_is_longest_prefix_and_multipath() -> None:
    rail_of = {"rail0": 0, "rail1": 1, "rail2": 2}
    routes = {
        r.destination: r
        for r in [
            KernelRoute(IPv4Network("10.200.1.0/24"), nexthops=("rail0", "rail2")),
            KernelRoute(IPv4Address("10.200.1.7"), IPv4Address("10.200.0.7"), "rail0"),
            KernelRoute(IPv4Address("10.200.1.8"), kind="unreachable"),
            KernelRoute(IPv4Network("10.200.2.0/24"), netdev="ens9"),  # not this host's
        ]
    }
    assert table_egress(routes, rail_of, IPv4Address("10.200.1.5")) == (0, 2)
    assert table_egress(routes, rail_of, IPv4Address("10.200.1.7")) == (0,)
    assert table_egress(routes, rail_of, IPv4Address("10.200.1.8")) == ()
    assert table_egress(routes, rail_of, IPv4Address("10.200.2.1")) == (-1,)
    assert table_egress(routes, rail_of, IPv4Address("10.200.3.1")) == ()


def test_check_installed_flags_unrouted_and_dead_rails() -> None:
    fabric = generate_rail_optimized(hosts=2, rails=2)
    a, b = fabric.host_names
    # a reaches rail r's endpoints (10.200.r.0/24) on rail r only
    home = [KernelRoute(IPv4Network(f"10.200.{r}.0/24"), netdev=f"rail{r}") for r in (0, 1)]
    tables = {a: {r.destination: r for r in home}}
    assert check_installed(fabric, {}, tables, [(a, b)]) == []
    # b's rail 1 is down: a still sends its rail-1 endpoint out of rail 1
    found = check_installed(fabric, {b: {1}}, tables, [(a, b)])
    assert [(m.kind, m.rails, m.usable_both) for m in found] == [("dead_rail", (1,), (0,))]
    # an empty table reaches nothing the model reaches
    found = check_installed(fabric, {}, {a: {}}, [(a, b)])
    assert {m.kind for m in found} == {"unrouted"} and len(found) == 2


def test_percentile_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert (percentile(xs, 50), percentile(xs, 99), percentile(xs, 100)) == (50.0, 99.0, 100.0)
    assert percentile([], 50) is None


# -- over Mosquitto -------------------------------------------------------------------------


@pytest.mark.real
async def test_single_link_down_over_mosquitto(single_link_down_mosquitto: LiveReport) -> None:
    r = single_link_down_mosquitto
    assert r.passed, r.text()
    assert r.failures == [] and r.unsettled == [] and r.mismatch_count == 0
    # time 0, the reroute, the re-admission: each a settle checked on the installed routes
    assert r.settles == 3
    (f,) = r.faults
    assert (f.entry, f.kind, f.host, f.rerouted) == (0, "link_down", "gpu001", True)
    # the host moved its own traffic at once; every host (4) got the new epoch and acked it
    assert f.fast_path_ms is not None and f.last_ack_ms is not None
    assert f.fast_path_ms < f.first_ack_ms <= f.last_ack_ms < 1000  # the scenario's bound
    assert (f.plans, f.acked) == (4, 4)
    # one plan for the failure, one for the re-admission after the 2 s hold-down (at 10 s)
    assert r.plans_per_host == {h: 2 for h in HOSTS4}
    assert r.max_plans_per_host_per_event == 1
    [(host, rail, at)] = [(x["host"], x["rail"], x["at_s"]) for x in r.readmissions]
    assert (host, rail) == ("gpu001", 1) and 10.0 <= at < 11.0
    assert [(e.name, e.held) for e in r.expectations] == [
        ("reachability", True),
        ("max_reroute_ms", True),
    ]
    assert r.latency()["last_ack_ms"]["max"] == f.last_ack_ms


@pytest.mark.real
async def test_broker_outage_fast_path_then_catch_up(tmp_path: Path) -> None:
    require_binary("mosquitto")
    r = await run(golden("broker-outage"), workdir=tmp_path)
    assert r.passed, r.text()
    assert r.mismatch_count == 0 and r.unsettled == []
    (f,) = r.faults  # gpu001 rail 0 at 4 s, while the broker is down (2-7 s)
    assert (f.at_s, f.host, f.rerouted) == (4.0, "gpu001", True)
    # the fast path needs no bus; the plans wait for the broker (back 3 s after the fault),
    # the agents' reconnect (backoff up to 1 s) and their re-announcement
    assert f.fast_path_ms is not None and f.fast_path_ms < 500
    assert f.last_ack_ms is not None and 3000 < f.last_ack_ms < 8000
    assert (f.plans, f.acked) == (4, 4)
    [rec] = r.recoveries
    assert (rec.kind, rec.at_s) == ("broker_up", 7.0) and rec.settled_ms is not None
    # one plan for the failure (after the outage), one for the re-admission
    assert r.plans_per_host == {h: 2 for h in HOSTS4}


@pytest.mark.real
async def test_switch_faults_survive_a_broker_outage_and_a_service_restart(
    tmp_path: Path,
) -> None:
    require_binary("mosquitto")
    r = await run(golden("faults-across-outage"), workdir=tmp_path)
    # Before the fix, the broker lost the retained fabric/faults with its restart and the new
    # service planned on nominal health: 184 dead_rail mismatches (rail 3 of su1's hosts
    # routed onto the cut-off su1-leaf3) and no settle after service_up.
    assert r.passed, r.text()
    assert r.mismatch_count == 0 and r.unsettled == []
    assert [(x.kind, x.at_s) for x in r.recoveries] == [("broker_up", 5.0), ("service_up", 10.0)]
    assert all(x.settled_ms is not None for x in r.recoveries)
    # the cut at 1 s moved rail 3 of su1's 8 hosts once; nothing moved back until 16 s
    assert r.plans_per_host == {f"gpu{i:03d}": 2 for i in range(16)}


@pytest.mark.real
async def test_agent_restart_leaves_no_leaked_routes(tmp_path: Path) -> None:
    require_binary("mosquitto")
    seen: dict[str, object] = {}

    def inspect(fleet: SimulatedFleet) -> None:
        agent, table = fleet.agents["gpu003"], fleet.tables["gpu003"]
        seen["same_table"] = agent.table is table
        seen["fast_paths"] = agent.stats.fast_paths
        seen["installed"] = dict(agent.applier.installed)
        seen["routes"] = dict(table.routes)
        seen["epoch"] = (agent.applier.applied_epoch, fleet.service.state.plans["gpu003"].epoch)

    r = await run(golden("agent-restart"), workdir=tmp_path, inspect=inspect)
    assert r.passed, r.text()
    assert r.mismatch_count == 0  # includes every table against its agent's plan, each settle
    (f,) = r.faults  # gpu003 rail 2 fails at 3 s while its agent is away (2-5 s)
    assert f.host == "gpu003" and (f.plans, f.acked) == (4, 4)
    # the restarted agent (5 s) reads the port down and applies the backup at once
    assert f.fast_path_ms is not None and 1900 < f.fast_path_ms < 3000
    assert f.last_ack_ms is not None and f.fast_path_ms < f.last_ack_ms
    [rec] = r.recoveries
    assert (rec.kind, rec.host) == ("agent_up", "gpu003") and rec.settled_ms is not None
    # the new agent kept the old one's table and left nothing behind: the table holds
    # exactly what it applied (the link is back and re-admitted at the end: no overlay)
    assert seen["same_table"] is True and seen["fast_paths"] == 1
    assert seen["routes"] == seen["installed"] and len(seen["routes"]) == 4
    applied, planned = seen["epoch"]
    assert applied == planned
    assert [(x["host"], x["rail"]) for x in r.readmissions] == [("gpu003", 2)]


# -- the memory bus, through the CLI --------------------------------------------------------


@pytest.mark.real
def test_memory_bus_gives_what_mosquitto_gives(
    single_link_down_mosquitto: LiveReport, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(SCENARIOS_DIR / "single-link-down.yaml")
    code = main(["sim", "run", path, "--bus", "memory", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out["failures"]
    mosq = single_link_down_mosquitto.to_dict()
    assert out["bus"] == "memory" and mosq["bus"] == "mosquitto"
    for key in (
        "passed",
        "plans_per_host",
        "settles",
        "mismatch_count",
        "max_plans_per_host_per_event",
        "solves",
        "unsettled",
    ):
        assert out[key] == mosq[key], key

    def shape(faults: list[dict]) -> list[tuple]:
        return [(f["entry"], f["host"], f["rerouted"], f["plans"], f["acked"]) for f in faults]

    assert shape(out["faults"]) == shape(mosq["faults"]) == [(0, "gpu001", True, 4, 4)]
    assert out["faults"][0]["last_ack_ms"] < 1000
