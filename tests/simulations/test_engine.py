"""The simulated-clock replay: golden scenarios through the real monitor, state and solver."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from linkguard.cli import main
from linkguard.simulations.engine import replay, run
from linkguard.simulations.runreport import ExpectResult
from linkguard.simulations.scenario import (
    SCENARIOS_DIR,
    expand,
    load_scenario,
    shipped_scenarios,
)

#: the service's default RFC 8405 initial solve delay: what a failure after a quiet period waits
INITIAL_MS = 0.0


def golden(name: str):
    return load_scenario(SCENARIOS_DIR / f"{name}.yaml")


def reroutes(report) -> list[tuple[int, float, float | None]]:
    return [(f.entry, f.at_s, f.reroute_ms) for f in report.faults]


def test_single_link_down() -> None:
    r = run(golden("single-link-down"))
    assert r.passed and r.failures == []
    # down at 2 s: one solve after the initial delay; up at 8 s: held down 2 s, one solve after
    # the re-admission at 10 s. Each solve gives all 4 hosts a new plan.
    assert (r.events, r.solves, r.reroutes, r.settles) == (2, 2, 2, 3)
    assert r.plans_per_host == {f"gpu00{i}": 2 for i in range(4)}
    assert (r.plans_total, r.plans_max_per_host, r.max_plans_per_host_per_event) == (8, 2, 1)
    assert reroutes(r) == [(0, 2.0, INITIAL_MS)]
    assert r.readmissions == [{"host": "gpu001", "rail": 1, "at_s": 10.0}]
    assert [(e.name, e.observed, e.held) for e in r.expectations] == [
        ("reachability", 0, True),
        ("max_reroute_ms", INITIAL_MS, True),
    ]


def test_flapping_link_costs_one_reroute_and_one_readmission() -> None:
    loaded = golden("flapping-link")
    ups = [e.at_s for e in expand(loaded) if e.kind == "port_up"]
    downs = [e.at_s for e in expand(loaded) if e.kind == "port_down"]
    r = run(loaded)
    assert r.passed
    # only the first down moves traffic; the other four come while the port is held down
    assert reroutes(r) == [(0, downs[0], INITIAL_MS)] + [(0, t, None) for t in downs[1:]]
    assert (r.events, r.solves, r.reroutes) == (10, 2, 2)
    assert r.plans_per_host == {f"gpu00{i}": 2 for i in range(4)}
    # five flaps: hold-down min(8, 1 * 2**4) = 8 s after the last return
    assert r.readmissions == [{"host": "gpu002", "rail": 2, "at_s": pytest.approx(ups[-1] + 8)}]
    assert ups[-1] == 11.124478  # about 19.1 s, as the scenario says


def test_leaf_reboot_is_one_plan_per_host_per_event() -> None:
    r = run(golden("leaf-reboot"))
    assert r.passed
    # solves: the leaf and its 4 ports at 2 s (one batch), the leaf back at 7 s (its ports
    # still held down: no plan changes), the 4 ports re-admitted at 8 s (one batch)
    assert (r.events, r.solves, r.reroutes) == (10, 3, 2)
    assert r.plans_per_host == {f"gpu00{i}": 2 for i in range(8)}
    assert r.max_plans_per_host_per_event == 1
    assert reroutes(r) == [(0, 2.0, INITIAL_MS)]
    assert r.readmissions == [{"host": f"gpu00{i}", "rail": 2, "at_s": 8.0} for i in range(4)]
    assert r.expectations[-1].name == "max_plans_per_host_per_event"
    assert (r.expectations[-1].limit, r.expectations[-1].held) == (2, True)


def test_leaf_reboot_of_a_degraded_rail_re_plans_only_its_su() -> None:
    """large-leaf-reboot: 8 hosts lose rail 2, which makes it degraded (issue 23). Every host's
    full plan changes (the others' backups avoid rail 2, and they gain /32s), but only the
    SU's hosts get a plan message; the other 8 keep their first (compact) plan and take the
    change from the SU's peer routes, which carry the degraded rail while it lasts."""
    r, hosts = replay(golden("large-leaf-reboot"), keep_plans=True)
    assert r.passed
    assert (r.events, r.solves, r.reroutes) == (18, 3, 2)
    assert r.plans_per_host == {f"gpu{i:03d}": 2 for i in range(16)}
    assert r.max_plans_per_host_per_event == 1
    log = hosts["gpu000"].log
    plans = {h: len(log.topics[(True, h)]) for h in hosts}
    assert plans == {f"gpu{i:03d}": 3 if i < 8 else 1 for i in range(16)}
    peers = {h: [m for _, _, m in ms] for (plan, h), ms in log.topics.items() if not plan}
    assert sorted(peers) == [f"gpu{i:03d}" for i in range(8)]
    for ms in peers.values():  # down (rail 2 degraded), back (whole: nothing degraded)
        assert [(m.degraded, bool(m.classes)) for m in ms] == [([2], True), ([], False)]
    for i in range(8, 16):  # whole: the full plan in place, from the first compact plan
        assert log.topics[(True, f"gpu{i:03d}")][0][2].shared is not None


def test_uplink_loss_moves_traffic_only_when_the_leaf_is_cut_off() -> None:
    r = run(golden("uplink-loss"))
    assert r.passed
    # 2 s: one of two cables, nothing moves; 10 s: the fourth pair's cables cut su1-leaf3
    # off (entries 1-3 leave it an uplink); 15 s: the first pair back reconnects it
    assert reroutes(r) == [
        (0, 2.0, None),
        (1, 10.0, None),
        (2, 10.0, None),
        (3, 10.0, None),
        (4, 10.0, INITIAL_MS),
    ]
    assert (r.events, r.solves, r.reroutes) == (10, 2, 2)
    assert r.plans_per_host == {f"gpu{i:03d}": 2 for i in range(16)}
    assert r.readmissions == []


@pytest.mark.parametrize("path", shipped_scenarios(), ids=lambda p: p.stem)
def test_every_shipped_scenario_passes(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if "\nchaos:" in path.read_text():  # a storm in the lab's kernel, no timeline to replay
        assert main(["sim", "run", str(path)]) == 2  # sent to `sim lab` (test_labchaos.py)
        return
    assert main(["sim", "run", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path.stem}: PASSED\n")
    assert "0 mismatches" in out


def test_broker_outage_holds_the_failure_until_the_bus_is_back() -> None:
    r = run(golden("broker-outage"))
    assert r.passed and r.skipped == []
    # the link fails at 4 s, in the outage (2-7 s): its state reaches the service when the
    # broker returns, and is solved after the initial delay
    assert reroutes(r) == [(1, 4.0, 3000 + INITIAL_MS)]
    assert (r.events, r.solves, r.settles, r.settles_skipped) == (4, 2, 3, 0)
    assert r.readmissions == [{"host": "gpu001", "rail": 0, "at_s": 13.0}]


def test_service_restart_plans_after_its_startup_settle() -> None:
    r = run(golden("service-restart"))
    assert r.passed and r.skipped == []
    # down at 3 s while the service is away (2-5 s): the new instance collects retained
    # states for startup_settle_s (1 s) and then solves: 6 s
    assert reroutes(r) == [(1, 3.0, 3000.0)]
    assert r.plans_per_host == {f"gpu00{i}": 2 for i in range(4)}


def test_agent_restart_reads_the_port_it_did_not_see_fail() -> None:
    r = run(golden("agent-restart"))
    assert r.passed and r.skipped == []
    # the link fails at 3 s while gpu003's agent is down (2-5 s); the restarted agent reads
    # it down at 5 s and the service solves 10 ms later
    assert reroutes(r) == [(1, 3.0, 2000 + INITIAL_MS)]
    # the link returns at 10 s: held down 1 s by the new agent (no flap history)
    assert r.readmissions == [{"host": "gpu003", "rail": 2, "at_s": 11.0}]


def test_an_expectation_that_cannot_hold_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((SCENARIOS_DIR / "single-link-down.yaml").read_text())
    doc["expect"] = {"max_reroute_ms": 5}
    doc["debounce_ms"] = 20  # the port's return waits this long; still within the scenario
    doc["timeline"] = [
        {"at_s": 2, "kind": "link_down", "host": "gpu001", "rail": 1},
        # a second failure 1 s later: the back-off learned churn, it waits the long delay
        {"at_s": 3, "kind": "link_down", "host": "gpu002", "rail": 2},
        {"at_s": 8, "kind": "link_up", "host": "gpu001", "rail": 1},
        {"at_s": 9, "kind": "link_up", "host": "gpu002", "rail": 2},
    ]
    path = tmp_path / "too-fast.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = run(load_scenario(path))
    assert not r.passed and r.mismatch_count == 0
    assert r.failures == [
        "max_reroute_ms: slowest reroute 1000 ms (timeline[1] at 3 s), limit 5 ms"
    ]

    assert main(["sim", "run", str(path)]) == 1
    out = capsys.readouterr().out
    assert "single-link-down: FAILED" in out
    assert "expect max_reroute_ms: FAILED (slowest reroute 1000 ms" in out

    assert main(["sim", "run", str(path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False
    assert data["failures"] == r.failures
    assert data["faults"] == [
        {"entry": 0, "kind": "link_down", "at_s": 2.0, "reroute_ms": 0.0},
        {"entry": 1, "kind": "link_down", "at_s": 3.0, "reroute_ms": 1000.0},
    ]


def test_a_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("schema: linkguard.scenario/v0\n")
    assert main(["sim", "run", str(path)]) == 2
    assert "this linkguard reads `schema: linkguard.scenario/v1`" in capsys.readouterr().err


def test_progress_reports_each_tenth_of_the_simulated_time() -> None:
    seen: list[float] = []
    r = run(golden("flapping-link"), progress=seen.append)
    assert r.passed
    # 30 s simulated: every 3 s that the replay passed, then the end
    assert seen == pytest.approx([3.0 * k for k in range(1, 11)])


def test_mismatch_lines_say_how_many_were_not_shown() -> None:
    from linkguard.simulations.engine import mismatch_lines

    kept = [f"m{i}" for i in range(7)]
    assert mismatch_lines(7, kept) == [
        *(f"    m{i}" for i in range(5)),
        "    ... and 2 more (--json lists the first 20)",
    ]
    assert mismatch_lines(2, kept[:2]) == ["    m0", "    m1"]


def test_fast_path_only_moves_the_traffic_while_the_service_is_away() -> None:
    """fast-path-only: two host links fail while the service is away (2-10 s); each agent's
    fast path moves its rail's traffic at once (the backup of the plan in place), the
    service plans for both once it is back (10 s + its 1 s startup settle)."""
    r = run(golden("fast-path-only"))
    assert r.passed and r.skipped == []
    assert r.fast_paths == [
        {"host": "gpu001", "port": "mlx5_2/1", "rail": 2, "at_s": 3.0},
        {"host": "gpu003", "port": "mlx5_0/1", "rail": 0, "at_s": 4.0},
    ]
    fast = [e for e in r.expectations if e.name == "fast_path"]
    assert [(e.held, e.observed, e.detail) for e in fast] == [
        (True, 2, "2 of 2 port(s) down in use moved by their agent's fast path")
    ]
    assert reroutes(r) == [(1, 3.0, 8000.0), (2, 4.0, 7000.0)]
    assert r.to_dict()["fast_paths"] == r.fast_paths
    assert "  fast path: gpu001 mlx5_2/1 (rail 2) at 3 s\n" in r.text()


def test_fast_path_expectation_fails_without_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outcome depends on the agents' fast path: an agent core that never takes it (no
    status a port may go down from) fails ``expect: fast_path``, nothing else."""
    monkeypatch.setattr("linkguard.agent.core.FAST_PATH_FROM", frozenset())
    r = run(golden("fast-path-only"))
    assert r.fast_paths == []
    assert r.mismatch_count == 0 and not r.passed
    assert r.failures == [
        "fast_path: 0 of 2 port(s) down in use moved by their agent's fast path "
        "(not: gpu001 rail 2 at 3 s)"
    ]


def test_fast_paths_of_the_shipped_outages() -> None:
    """The fast path needs neither bus nor service: a link lost during a broker outage or a
    service restart is moved at once; an agent restarted with a port down takes it when it
    reads the port; a port held down (a flap's second fall) takes none."""
    assert [(f["host"], f["at_s"]) for f in run(golden("broker-outage")).fast_paths] == [
        ("gpu001", 4.0)
    ]
    assert [(f["host"], f["at_s"]) for f in run(golden("service-restart")).fast_paths] == [
        ("gpu002", 3.0)
    ]
    assert [(f["host"], f["at_s"]) for f in run(golden("agent-restart")).fast_paths] == [
        ("gpu003", 5.0)
    ]
    assert len(run(golden("flapping-link")).fast_paths) == 1


def test_fast_path_acked_judges_a_real_runs_port_faults() -> None:
    """``sim run --bus``'s ``fast_path``: each down transition of one host's ports (switch
    faults have no host) needs a fast-path ack."""

    def fault(host: str | None, ms: float | None, at_s: float = 3.0) -> SimpleNamespace:
        return SimpleNamespace(host=host, fast_path_ms=ms, at_s=at_s)

    ok = ExpectResult.fast_path_acked([fault("gpu001", 2.0), fault(None, None)])
    assert (ok.held, ok.observed) == (True, 1)
    bad = ExpectResult.fast_path_acked([fault("gpu001", 2.0), fault("gpu002", None, 4.0)])
    assert (bad.held, bad.observed) == (False, 1)
    assert bad.detail.endswith("(not: gpu002 at 4 s)")
    none = ExpectResult.fast_path_acked([fault(None, None)])
    assert not none.held and none.detail.endswith("(no port went down in use)")


def test_a_job_scenario_says_its_job_was_not_run() -> None:
    """The engine has no training job: a job scenario's job and its expectations are named
    as skipped (the text and the JSON), not passed over in silence."""
    r = run(golden("job-link-down"))
    assert r.passed
    assert r.skipped == [
        "job: the training job and its expectations (job_max_stall_ms, job_rank_failures) "
        "run only in `linkguard sim lab`"
    ]
    assert {e.name for e in r.expectations} == {"reachability", "max_reroute_ms"}
    assert "not modelled, skipped: 1\n    job: the training job" in r.text()
    assert "(max 0 ms on the simulated clock)" in r.text()
