"""Issue 21, item 4 (the chaos run), short form: the real topology service and 8 real agents
(:class:`~linkguard.simulations.fleet.SimulatedFleet`) over a private Mosquitto, the agents
behind the chaos proxy (10 % of the publishes dropped, some duplicated, delayed and reordered,
two connections cut) during a seeded storm of port flaps. After the storm every host acks the
service's current epoch within the stated time, and the ledger holds every port event the
agents journaled exactly once with the agent's times.

The pure parts (the storm a seed makes, the rules, the verdict, the ledger audit) are tested
first, without a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from linkguard.simulations.chaos import run_chaos
from linkguard.simulations.chaosproxy import Rule
from linkguard.simulations.chaosstorm import (
    audit_events,
    chaos_rules,
    percentile,
    storm_schedule,
    verdict,
)
from linkguard.simulations.labchaoscheck import down_episodes, outage_problems
from tests.support import require_binary

HOSTS = ["a", "b", "c"]


def test_a_seed_makes_one_storm_that_heals() -> None:
    one = storm_schedule(HOSTS, [0, 1], seed=3, duration_s=4, events_per_s=10)
    assert one == storm_schedule(HOSTS, [0, 1], seed=3, duration_s=4, events_per_s=10)
    assert one != storm_schedule(HOSTS, [0, 1], seed=4, duration_s=4, events_per_s=10)
    assert all(0 < e.t_s <= 4 for e in one)
    assert [e.t_s for e in one] == sorted(e.t_s for e in one)
    # per port: down, up, down, ... and up last (healed)
    for port in {(e.host, e.rail) for e in one}:
        acts = [e.action for e in one if (e.host, e.rail) == port]
        assert acts == ["link_down", "link_up"] * (len(acts) // 2), (port, acts)
    with pytest.raises(ValueError, match="positive"):
        storm_schedule(HOSTS, [0], seed=1, duration_s=0, events_per_s=1)


def test_the_rules_for_a_loss_rate() -> None:
    rules = chaos_rules(0.1, cuts=2)
    assert rules[0] == Rule("cut", "both", "#", probability=0.01, count=2, skip=20)
    assert [(r.action, r.probability) for r in rules[1:]] == [
        ("drop", 0.1),
        ("duplicate", 0.05),
        ("delay", 0.05),
        ("reorder", 0.05),
    ]
    assert [r.action for r in chaos_rules(0.0, cuts=0)] == [
        "drop",
        "duplicate",
        "delay",
        "reorder",
    ]
    with pytest.raises(ValueError, match="between 0 and 1"):
        chaos_rules(1.5, cuts=0)


def test_the_verdict_and_the_ledger_audit() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    v = verdict({"a": 0.5, "b": 2.0, "c": None}, within_s=1.0)
    assert (v.converged, v.not_converged, v.passed) == (False, ["b", "c"], False)
    assert (v.convergence_p50_s, v.convergence_max_s) == (0.5, 2.0)
    ok = verdict({"a": 0.5}, within_s=1.0, journaled=3, lost=0, duplicated=0, time_mismatch=0)
    assert ok.passed
    assert not verdict({"a": 0.5}, within_s=1.0, lost=1).passed
    ev = [("a", "j", 1, 10.0, "mlx5_0", 1, "down"), ("a", "j", 2, 11.0, "mlx5_0", 1, "up")]
    assert audit_events(ev, ev).__dict__ == {
        "journaled": 2,
        "lost": 0,
        "duplicated": 0,
        "mismatched": 0,
    }
    late = ("a", "j", 2, 11.5, "mlx5_0", 1, "up")
    a = audit_events(ev, [ev[0], ev[0], late])
    assert (a.lost, a.duplicated, a.mismatched) == (0, 1, 1)
    assert audit_events(ev, [ev[1]]).lost == 1


@pytest.mark.real
def test_chaos_run_short_form(tmp_path: Path) -> None:
    require_binary("mosquitto")
    within_s = 15.0
    r = asyncio.run(
        run_chaos(hosts=8, loss=0.1, seed=1, storm_s=4, within_s=within_s, workdir=tmp_path)
    )
    v = r.verdict
    print(
        f"\nchaos short form: {r.port_events} port events, dropped {r.dropped}, duplicated "
        f"{r.duplicated}, delayed {r.delayed}, reordered {r.reordered}, cut {r.cut}; "
        f"convergence p50 {v.convergence_p50_s} s p99 {v.convergence_p99_s} s; events "
        f"{v.events_journaled} journaled, {v.events_missing_until_reconnect} missing until a "
        f"reconnect, {v.events_lost} lost, {v.events_duplicated} dup"
    )
    # the storm happened: faults of every kind, connections cut and re-made
    assert r.port_events >= 20
    assert r.dropped > 0 and r.duplicated > 0 and r.delayed > 0 and r.reordered > 0
    assert r.cut >= 1 and r.connections >= 8 + r.cut
    # every host acked the current epoch within the stated time
    assert v.converged, r.convergence_s
    assert all(t is not None and t <= within_s for t in r.convergence_s.values())
    # the ledger: every journaled event once, with the agent's time (an event whose publish
    # was dropped is replayed on the agent's next reconnect: the run makes one when needed)
    assert v.events_journaled is not None and v.events_journaled >= r.port_events // 2
    assert v.events_missing_until_reconnect is not None
    assert (v.events_lost, v.events_duplicated, v.events_time_mismatch) == (0, 0, 0)
    assert v.passed
    # `linkguard report` on that ledger, as a user runs it: each outage once, starting at its
    # first port's down (the agent's time) and lasting its longest down episode (the lab chaos
    # run's check, simulations/labchaoscheck.py)
    ledger = tmp_path / "ledger.sqlite3"
    proc = subprocess.run(
        [sys.executable, "-m", "linkguard.cli", "report", "--ledger", str(ledger),
         "--format", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    outages = json.loads(proc.stdout)["outages"]
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        events = [dict(r) for r in conn.execute("SELECT * FROM port_events")]
        ports = conn.execute("SELECT outage_id, host, hca, port FROM outage_ports").fetchall()
    episodes = down_episodes(events)
    print(f"report: {len(outages)} outages for {len(episodes)} port down episodes")
    assert len(episodes) >= 5 and outages
    assert outage_problems(episodes, outages, [tuple(p) for p in ports]) == []


def test_sim_chaos_refuses_a_loss_rate_above_one(capsys: pytest.CaptureFixture[str]) -> None:
    from linkguard.cli import main

    assert main(["sim", "chaos", "--loss", "2"]) == 2
    assert "--loss 2.0: between 0 and 1" in capsys.readouterr().err


def test_sim_chaos_refuses_a_workdir_with_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from linkguard.cli import main

    (tmp_path / "left-over").write_text("x")
    assert main(["sim", "chaos", "--workdir", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.real
def test_sim_chaos_keeps_its_ledger_for_linkguard_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new user could not run `linkguard report` on a `sim chaos` run's ledger: the run
    removed its files. `--workdir` keeps them."""
    require_binary("mosquitto")
    from linkguard.cli import main

    work = tmp_path / "run"
    argv = ["sim", "chaos", "--hosts", "2", "--rails", "1", "--loss", "0", "--storm-s", "1"]
    assert main([*argv, "--workdir", str(work)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "convergence p50 " in out and "e-0" not in out  # rounded
    assert main(["report", "--ledger", str(work / "ledger.sqlite3"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outage_counts"]["outages"] == len(report["outages"]) >= 1
